"""Training: `phalanx.Model` and everything behind it. Import from the public faces instead.

The rooms, highest first; a module imports its own room and the rooms below it, never one
above (`tests/test_structure.py` checks it), and nothing outside `model.py` touches a
`Model`'s private attributes:

- `model.py`, `summary.py`: the Keras-shaped face (`compile`, `fit`, `evaluate`,
  `predict`, weights, `summary`). It resolves what `compile` is given and delegates the
  rest to the model's `engine.Engine`.
- `loops/`: `fit`, `evaluate`, `predict`, and one phase's run over a feeder.
- `checkpoint/`: checkpoint files, their layout, Orbax, `ModelCheckpoint`,
  `BackupAndRestore` and preemption.
- `feeding/`: the way of a batch from the user's data to a compiled call's input.
- `engine/`: the one owner of training state (`Engine`), the pure steps, the compiled
  calls, packing, gradient accumulation, boundary checks and the FLOP rate.
- `adapters/`: each framework (Flax NNX, Keras 3) plugs in through `ModelAdapter`.
- `api/`: the Keras-compatible surface: losses, metrics, optimizers, precision policies,
  callbacks and the bridge to Keras 3 objects.

See docs/architecture.md for a picture of how a batch travels and who owns which state.
"""
