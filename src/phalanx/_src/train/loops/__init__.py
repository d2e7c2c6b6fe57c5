"""The loops: `fit` (the epoch loop), `evaluate`, `predict`, and `phase.run_phase`.

A loop turns Keras's arguments into host batches (`feeding.sources`), runs them through a
feeder and the compiled calls (`phase.run_phase`), and drives the callbacks. The loops
hold no training state between calls: it lives in the model's `Engine`.

May import: `checkpoint` (preemption), `feeding`, `engine`, `api` (callbacks, fit
options), and the data and strategy layers; never `model.py`.
"""
