"""Checkpoints: files and their record (checksums, checked before anything loads), their
layout, the folder's lock, Orbax for several processes, the checkpoint callbacks
(`ModelCheckpoint`, `BackupAndRestore`) and preemption (SIGTERM: back up at one agreed
step, exit 143); and, written by the same checkpointer, `phalanx.Checkpoint`,
`CheckpointManager` and `latest_checkpoint` for custom loops (`tf_checkpoint`, `manager`,
`tracked`: the objects a Checkpoint holds).

A checkpoint holds the `Engine`'s state and a JSON record (fit's position, the data
iterator's). The callbacks reach the state through `model.engine` (`state`,
`position`, `add_step_hook`), never through the model's private attributes. A damaged
checkpoint, or one that does not fit the model, raises `record.CheckpointError` naming its
file; nothing in a checkpoint folder that phalanx did not write is listed or deleted.

May import: `api` (the callback base) and the strategy and cluster layers; not `engine`,
`feeding`, `loops` or `model.py` (the engine object is handed over at run time).
"""
