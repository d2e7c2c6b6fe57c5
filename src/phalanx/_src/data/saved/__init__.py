"""Data preprocessed once: `Dataset.save` / `Dataset.load` and `Dataset.snapshot`.

A saved dataset is a directory of TFRecord shards of encoded elements, an index of where
each element lies, and a JSON file describing them (`codec` documents the format). `writer`
fills a partial directory that checkpoints can resume and that is published by one rename;
`reader` reads a published one with random access; `snapshot` writes one during a pass and
reads it back on later passes and runs, under a directory named by the pipeline's
`fingerprint`; `dataset_io` puts `save`, `load` and `snapshot` on `Dataset`. These modules
import the plan's nodes and `records.tfrecord_io`, and are imported only by `dataset`.
"""
