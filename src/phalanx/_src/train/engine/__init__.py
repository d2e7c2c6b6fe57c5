"""The engine: `Engine`, the one owner of a model's training state, and what it runs.

- `engine.Engine`: the state (as packed leaves between calls), the compiled calls,
  fit's position, the step hooks, metrics resets and log fetches.
- `step`: the pure train / test / predict steps; `accumulation`: gradient accumulation as
  an optax wrapper; `packing`: the state's scalars in one vector per bit width.
- `execution`: the phases' compiled calls (one `lax.scan` of K steps, or single steps).
- `checks`: bad input at the boundary, before anything compiles; `flop_rate`: FLOPs and
  MFU for the epoch logs; `transfers`: the ledger of host <-> device transfers.

May import: `adapters`, `api`, and the strategy and data layers; not `feeding`, `loops`,
`checkpoint` or `model.py`.
"""
