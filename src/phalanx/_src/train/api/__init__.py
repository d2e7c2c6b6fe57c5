"""The Keras-compatible surface: what `compile` and `fit` accept.

Losses (`losses`, `loss_base`), metrics (`metrics/`), optimizers (`optimizers`),
precision policies (`precision`), several outputs (`multi_output`), Keras's fit options
(`fit_options`), callbacks (`callbacks/`) and the bridge that turns Keras 3 objects into
these (`keras_bridge/`).

May import: the strategy, data, cluster and report layers; nothing else of `train`.
"""
