"""Checkpoints: files and their layout, Orbax for several processes, the checkpoint
callbacks (`ModelCheckpoint`, `BackupAndRestore`) and preemption (SIGTERM: back up at one
agreed step, exit 143).

A checkpoint holds the `Engine`'s state and a JSON record (fit's position, the data
iterator's). The callbacks reach the state through `model.engine` (`state`,
`position`, `add_step_hook`), never through the model's private attributes.

May import: `api` (the callback base) and the strategy and cluster layers; not `engine`,
`feeding`, `loops` or `model.py` (the engine object is handed over at run time).
"""
