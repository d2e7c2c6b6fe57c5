"""ImageNet-style TFRecord shards, written and read without TensorFlow, then trained on.

The 1,437 training images of the 8x8 digits shipped with phalanx are written the way
ImageNet's TFRecords are: JPEG bytes and an int64 label per tf.train.Example, spread over
8 shards. They are read back with the pipeline a TF user writes,

    TFRecordDataset(files, num_parallel_reads) -> shuffle -> map(parse + decode) -> batch -> fit

(the shuffle is global: the files are indexed for it). Before training, the share each of
2 hosts would read without the shuffle is shown (sharding by file), and the same records
are read from an ArrayRecord file with an exact global shuffle.

    python examples/record_files.py                  # 2 epochs, files in a temporary folder
    python examples/record_files.py --epochs 1 --folder /tmp/digit_shards
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from PIL import Image

import phalanx
from phalanx import data

SHARDS = 8
FEATURES = {
    "image/encoded": data.FixedLenFeature([], data.string),
    "image/class/label": data.FixedLenFeature([], np.int64),
}


def jpeg(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=95)
    return out.getvalue()


def write_shards(folder: Path) -> list[str]:
    """Writes the digits as `train-0000N-of-00008` TFRecord shards; returns their paths."""
    (x_train, y_train), _ = phalanx.datasets.digits.load_data()
    scale = 255 // phalanx.datasets.digits.MAX_PIXEL
    records = [
        data.make_example(
            {"image/encoded": jpeg((x * scale).astype(np.uint8)), "image/class/label": int(y)}
        )
        for x, y in zip(x_train, y_train, strict=True)
    ]
    paths = [str(folder / f"train-{s:05d}-of-{SHARDS:05d}") for s in range(SHARDS)]
    for shard, path in enumerate(paths):
        with data.TFRecordWriter(path) as writer:
            for record in records[shard::SHARDS]:
                writer.write(record)
    print(f"Wrote {len(records)} examples to {SHARDS} TFRecord shards in {folder}")
    return paths


def parse(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One serialized Example -> (8x8x1 float32 image in [0, 1], int32 label)."""
    example = data.parse_single_example(record, FEATURES)
    image = phalanx.image.decode_jpeg(example["image/encoded"], channels=1)
    return (image / 255.0).astype(np.float32), example["image/class/label"].astype(np.int32)


def create_dataset(paths: list[str], global_batch_size: int, shuffle: bool) -> data.Dataset:
    """The records, in tf.data's interleaved order or (with `shuffle`) globally shuffled
    each epoch, parsed and decoded, in global batches."""
    dataset = data.TFRecordDataset(paths, num_parallel_reads=4)
    if shuffle:
        dataset = dataset.shuffle(10_000, seed=0)
    return dataset.map(parse).batch(global_batch_size, drop_remainder=True)


class MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 64, rngs=rngs)
        self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x.reshape(x.shape[0], -1))))


def show_host_shares(paths: list[str], global_batch_size: int) -> None:
    """What each of 2 hosts reads: its own 4 files, in batches of half the global batch."""
    dataset = create_dataset(paths, global_batch_size, shuffle=False)
    for host in range(2):
        share = dataset.process_split(host, 2)  # what fit does on host `host` of 2
        rows = sum(len(labels) for _, labels in share)
        print(f"Host {host} of 2 reads {len(paths) // 2} shards: {rows} examples")


def read_array_record(folder: Path, paths: list[str]) -> None:
    """The same records in one ArrayRecord file, globally shuffled."""
    from array_record.python.array_record_module import ArrayRecordWriter

    target = str(folder / "train.array_record")
    writer = ArrayRecordWriter(target, "group_size:1")
    for record in data.TFRecordDataset(paths):
        writer.write(record)
    writer.close()
    dataset = data.ArrayRecordDataset([target])
    shuffled = dataset.shuffle(len(dataset), seed=0).map(parse).batch(8)
    _, labels = next(iter(shuffled))
    print(f"ArrayRecord: {len(dataset)} examples; first shuffled labels {labels.tolist()}")


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--folder", type=Path, default=None, help="default: a temporary one")
    args = parser.parse_args(argv)

    phalanx.cluster.resolve()  # the devices (PHALANX_CPU_DEVICES splits a CPU into several)
    strategy = phalanx.Strategy()
    print(f"Number of accelerators: {strategy.num_replicas_in_sync}")
    global_batch_size = 16 * strategy.num_replicas_in_sync
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        paths = write_shards(folder)
        show_host_shares(paths, global_batch_size)
        read_array_record(folder, paths)
        with strategy.scope():
            model = phalanx.Model(MLP(rngs=nnx.Rngs(0)))
            model.compile(
                optimizer="adam",
                loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        train = create_dataset(paths, global_batch_size, shuffle=True)
        history = model.fit(train, epochs=args.epochs)
    print("Training finished.")
    return history.history


if __name__ == "__main__":
    main()
