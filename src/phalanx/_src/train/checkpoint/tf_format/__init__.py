"""TensorFlow's checkpoint files, read without TensorFlow.

A TF checkpoint `<prefix>` is `<prefix>.index`, a LevelDB-style sorted table (`table`) of
`BundleEntryProto`s naming each tensor's dtype, shape, data shard, offset and CRC-32C, and
the shards `<prefix>.data-0000K-of-0000N` (`bundle`). Object-based checkpoints (TF 2's
`tf.train.Checkpoint`, Keras's TF-format `save_weights`) also store the
`_CHECKPOINTABLE_OBJECT_GRAPH` (`object_graph`), which says which object each tensor
belongs to; `matching` walks it onto Python objects as TF's restore does, `restore` applies
the values to a `phalanx.Checkpoint`'s entries, `keras2` maps Keras 2's `save_weights`
layout onto a Keras 3 model, `assign` is `init_from_checkpoint` for name-by-name mapping,
and `state_file` reads the `checkpoint` file naming a folder's newest checkpoint.

Every checksum the format has is checked: each table block's, each tensor's (a damaged
file raises `CheckpointError` naming it). Protobuf messages are decoded by the project's
wire decoder (`data.records.wire`).

May import: the `data.records` wire decoder and CRC helpers, `api`, and the checkpoint
room's `record` (the error class); never TensorFlow.
"""
