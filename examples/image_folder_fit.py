"""Train a CNN on a folder of PNG images, read through phalanx.data's file pipeline.

The images are the 1,797 8x8 handwritten digits shipped with phalanx, written once as PNG
files in `<folder>/<digit>/<n>.png` (Keras's `image_dataset_from_directory` layout), so
the example runs offline. The pipeline is the one a TF user writes for a folder of images:

    files -> shuffle every epoch -> read + decode (in parallel) -> augment -> batch -> fit

    python examples/image_folder_fit.py                       # 3 epochs, 2 process workers
    python examples/image_folder_fit.py --epochs 1 --workers 0 --folder /tmp/digits_png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from PIL import Image

import phalanx

IMAGE_SIZE = (8, 8)


def write_png_digits(folder: Path) -> int:
    """Writes the shipped digits as PNG files, one subfolder per class; returns the count."""
    (x_train, y_train), _ = phalanx.datasets.digits.load_data()
    scale = 255 // phalanx.datasets.digits.MAX_PIXEL  # pixels count 0..16 "on" bits
    for n, (image, label) in enumerate(zip(x_train, y_train, strict=True)):
        target = folder / str(int(label))
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * scale).astype(np.uint8)).save(target / f"{n:04d}.png")
    return len(x_train)


def augment(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A per-example shift by one pixel, chosen from the pixels (a pure function, as maps
    must be), then scaling to [0, 1]: Python-bound work, as augmentation code is."""
    shift = int(image.sum()) % 3 - 1
    return (np.roll(image, shift, axis=1) / 255.0).astype(np.float32), label


class CNN(nnx.Module):
    """Two 3x3 convolutions with max pooling, then a dense layer to 10 logits."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 16, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, (3, 3), rngs=rngs)
        self.out = nnx.Linear(2 * 2 * 32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), (2, 2))
        x = nnx.max_pool(jax.nn.relu(self.conv2(x)), (2, 2), (2, 2))
        return self.out(x.reshape(x.shape[0], -1))


def create_dataset(folder: Path, global_batch_size: int, workers: int) -> phalanx.data.Dataset:
    """Keras's directory reader, then a per-example augmentation in worker processes."""
    dataset = phalanx.data.image_dataset_from_directory(
        folder,
        color_mode="grayscale",
        image_size=IMAGE_SIZE,
        batch_size=None,  # batch after the per-example augmentation
        seed=0,
    )
    if workers:
        dataset = dataset.map(augment, num_parallel_calls=workers, workers="process")
    else:
        dataset = dataset.map(augment)
    return dataset.batch(global_batch_size, drop_remainder=True).prefetch(phalanx.data.AUTOTUNE)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="0: augment inline")
    parser.add_argument("--folder", type=Path, default=None, help="default: a temporary one")
    args = parser.parse_args(argv)

    strategy = phalanx.Strategy()
    print(f"Number of accelerators: {strategy.num_replicas_in_sync}")
    global_batch_size = 32 * strategy.num_replicas_in_sync
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch) / "digits_png"
        if not any(folder.glob("*/*.png")):
            print(f"Wrote {write_png_digits(folder)} PNG files to {folder}")
        train_dataset = create_dataset(folder, global_batch_size, args.workers)
        with strategy.scope():
            model = phalanx.Model(CNN(rngs=nnx.Rngs(0)))
            model.compile(
                optimizer="adam",
                loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        history = model.fit(train_dataset, epochs=args.epochs)
    print("Training finished.")
    return history.history


if __name__ == "__main__":
    main()
