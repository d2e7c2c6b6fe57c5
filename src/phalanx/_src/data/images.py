"""Images from files: Keras's `image_dataset_from_directory`, and tf.io's decoders
(implemented in `phalanx._src.image.decode`, re-exported here for `phalanx.data`).

The decoders follow tf.io's: `decode_png(contents, channels=0)` returns a (height, width,
channels) uint8 array, `channels` 0 keeping the file's own (1 for grayscale), 1 converting
to grayscale, 3 to RGB and 4 to RGBA. They take the bytes `read_file` returns (a uint8
array) or Python bytes, so a pipeline reads `list_files(...).map(lambda p:
decode_png(read_file(p)))`. JPEGs decode with libjpeg-turbo (simplejpeg) and the rest with
Pillow; both release the GIL, so such maps gain from threads (AUTOTUNE measures it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from phalanx._src.data import files, plan
from phalanx._src.data.executors import AUTOTUNE
from phalanx._src.data.seeds import default_seed
from phalanx._src.image.decode import decode_image as decode_image
from phalanx._src.image.decode import decode_jpeg as decode_jpeg
from phalanx._src.image.decode import decode_png as decode_png
from phalanx._src.image.decode import pillow_module

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")  # as Keras's
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}
_LABEL_MODES = ("int", "categorical", "binary", None)


def load_image(
    path: Any, size: tuple[int, int], channels: int, interpolation: str = "bilinear"
) -> np.ndarray:
    """The image at `path` resized to `size` (height, width), float32 in [0, 255]."""
    name = interpolation.upper()
    image_module = pillow_module()
    resample = getattr(image_module.Resampling, name, None)
    if resample is None:
        raise ValueError(
            f"interpolation {interpolation!r} is not one of bilinear, nearest, bicubic, "
            "lanczos, box, hamming"
        )
    with image_module.open(files._path(path)) as image:
        image = image.convert(_MODES[channels])
        if image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), resample)
        array = np.asarray(image, np.float32)
    return array[:, :, None] if array.ndim == 2 else array


def image_dataset_from_directory(
    directory: str | os.PathLike,
    labels: str | Sequence[int] | None = "inferred",
    label_mode: str | None = "int",
    class_names: Sequence[str] | None = None,
    color_mode: str = "rgb",
    batch_size: int | None = 32,
    image_size: tuple[int, int] = (256, 256),
    shuffle: bool = True,
    seed: int | None = None,
    validation_split: float | None = None,
    subset: str | None = None,
    interpolation: str = "bilinear",
    verbose: bool = True,
) -> Any:
    """A dataset of (image, label) batches from `directory/<class>/<image>`, as Keras's.

    Images are float32 in [0, 255] of shape `(*image_size, channels)` (channels 1, 3, 4 for
    color_mode "grayscale", "rgb", "rgba"). Labels come from the subfolder names in
    alphanumeric order ("inferred"), or from a list in the order of the sorted file paths;
    label_mode "int" (int32), "categorical" (one-hot float32), "binary" (float32 of shape
    (n, 1), two classes) or None (images only). As in Keras, the file list is shuffled
    once with `seed` before a `validation_split` cuts it (subset "training",
    "validation" or "both"), and the training data is reshuffled every epoch. Files are
    decoded in a `map` with AUTOTUNE. The result has `class_names`.

    Raises:
      ValueError: a bad argument (named with its legal values), or no image found.

    Example:
      >>> train = image_dataset_from_directory("digits/", image_size=(28, 28),
      ...     color_mode="grayscale", batch_size=64, validation_split=0.2,
      ...     subset="training", seed=0)
      >>> train.class_names   # ['0', '1', ..., '9']
    """
    if label_mode not in _LABEL_MODES:
        raise ValueError(f"label_mode must be one of {_LABEL_MODES}, got {label_mode!r}")
    if color_mode not in _COLOR_MODES:
        raise ValueError(f"color_mode must be one of {sorted(_COLOR_MODES)}, got {color_mode!r}")
    if subset not in (None, "training", "validation", "both"):
        raise ValueError(f"subset must be 'training', 'validation', 'both' or None, got {subset!r}")
    if (validation_split is None) != (subset is None):
        raise ValueError(
            "pass validation_split and subset together (e.g. validation_split=0.2, "
            f"subset='training'), got validation_split={validation_split!r}, subset={subset!r}"
        )
    if validation_split is not None and not 0 < validation_split < 1:
        raise ValueError(f"validation_split must be in (0, 1), got {validation_split!r}")
    if shuffle and seed is None:
        seed = default_seed()
    height, width = (int(d) for d in image_size)
    paths, found_labels, names = files.labelled_files(directory, IMAGE_EXTENSIONS, class_names)
    if labels is None:
        label_mode = None
    elif labels != "inferred":
        found_labels = np.asarray(labels, np.int32)
        if found_labels.shape != (len(paths),):
            raise ValueError(
                f"labels has {found_labels.shape} entries but {len(paths)} images were found"
            )
    if label_mode == "binary" and len(names) != 2:
        raise ValueError(f"label_mode='binary' needs exactly 2 classes, found {len(names)}")
    if verbose:
        print(f"Found {len(paths)} files belonging to {len(names)} classes.")
    order = np.arange(len(paths))
    if shuffle:
        np.random.RandomState(seed % 2**32).shuffle(order)
    paths_array, labels_array = np.array(paths)[order], found_labels[order]
    parts = {"training": np.arange(len(order))}
    if validation_split is not None:
        cut = len(order) - int(validation_split * len(order))
        parts = {"training": np.arange(cut), "validation": np.arange(cut, len(order))}
        if verbose and subset != "both":
            print(f"Using {len(parts[subset])} files for {subset}.")

    def build(rows: np.ndarray, reshuffle: bool) -> Any:
        return _dataset(
            paths_array[rows],
            labels_array[rows],
            label_mode,
            len(names),
            (height, width),
            _COLOR_MODES[color_mode],
            interpolation,
            batch_size,
            seed if reshuffle else None,
            names,
        )

    if subset == "both":
        return build(parts["training"], shuffle), build(parts["validation"], shuffle)
    return build(parts[subset or "training"], shuffle)


def _dataset(
    paths: np.ndarray,
    labels: np.ndarray,
    label_mode: str | None,
    num_classes: int,
    size: tuple[int, int],
    channels: int,
    interpolation: str,
    batch_size: int | None,
    seed: int | None,
    names: list[str],
) -> Any:
    from phalanx._src.data.dataset import Dataset

    if not len(paths):
        raise ValueError("the validation_split leaves no file for this subset")
    if label_mode == "categorical":
        target = np.eye(num_classes, dtype=np.float32)[labels]
    elif label_mode == "binary":
        target = labels.astype(np.float32)[:, None]
    else:
        target = labels
    leaves = [paths] if label_mode is None else [paths, target]
    treedef = plan.Source.single_leaf() if label_mode is None else _pair_treedef()
    dataset = Dataset(plan.Source(leaves, treedef))
    if seed is not None:
        dataset = dataset.shuffle(8 * (batch_size or 1), seed=seed)
    loader = _Loader(size, channels, interpolation, label_mode is not None)
    dataset = dataset.map(loader, num_parallel_calls=AUTOTUNE)
    if batch_size is not None:
        dataset = dataset.batch(batch_size)
    dataset.class_names = names
    return dataset


def _pair_treedef() -> Any:
    import jax

    return jax.tree.structure((0, 0))


class _Loader:
    """The map of `image_dataset_from_directory` (a class, so process workers can pickle it)."""

    def __init__(self, size: tuple[int, int], channels: int, interpolation: str, labelled: bool):
        self.size, self.channels = size, channels
        self.interpolation, self.labelled = interpolation, labelled

    def __call__(self, path: Any, label: Any = None) -> Any:
        image = load_image(path, self.size, self.channels, self.interpolation)
        return (image, label) if self.labelled else image
