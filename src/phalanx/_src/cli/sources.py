"""What `phalanx train` trains: its data and model, built in or named by the user.

Built in: MNIST (from `--data-dir`, `$PHALANX_DATA_DIR`, the cache, then the download) and,
when MNIST cannot be had, the UCI digits shipped inside the package, so the main job runs on
any machine, offline included; the seed's MLP or a small convnet sized to the images.

The user's own: `--model package.module:factory` and `--data package.module:loader`, two
functions called with no arguments (or with `seed=` when they take one). The factory
returns a Flax NNX module or a Keras 3 model (anything `phalanx.Model` accepts); the loader
returns `(x_train, y_train), (x_test, y_test)` arrays, or `(train, test)` datasets that
already batch (anything `fit` accepts).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

BUILTIN_MODELS = ("mlp", "cnn")
BUILTIN_DATA = ("mnist", "digits")


class SourceError(ValueError):
    """A bad `--model` / `--data` value or loader result; the message says what to do."""


@dataclasses.dataclass
class TrainData:
    """The data of one run.

    Attributes:
      name: 'mnist', 'digits', or the user's `module:loader` reference.
      train, test: `(x, y)` NumPy arrays, or datasets that batch themselves.
      note: one line to print before training (e.g. why MNIST was replaced), or None.
      image_shape: (height, width) of built-in images, for the built-in models.
      num_classes: classes of the built-in data.
      batch_per_replica: the default per-replica batch.
      base_learning_rate: the 'auto' learning rate at a global batch of 128 (Adam).
    """

    name: str
    train: Any
    test: Any
    note: str | None = None
    image_shape: tuple[int, int] | None = None
    num_classes: int = 10
    batch_per_replica: int = 128
    base_learning_rate: float = 2e-3

    @property
    def arrays(self) -> bool:
        """Whether train and test are `(x, y)` arrays that the CLI batches itself."""
        return all(_is_xy(split) for split in (self.train, self.test))


def _is_xy(split: Any) -> bool:
    return (
        isinstance(split, tuple)
        and len(split) == 2
        and all(isinstance(a, np.ndarray) or hasattr(a, "__array__") for a in split)
    )


def resolve_reference(reference: str, flag: str) -> Callable[..., Any]:
    """The function named by 'package.module:attribute' (the current folder is importable).

    Args:
      reference: e.g. 'mymodels:build' or 'pkg.sub.data:load'.
      flag: the option that gave it, for messages ('--model').

    Returns:
      The callable.

    Raises:
      SourceError: a malformed reference, a module that cannot be imported, a missing
        attribute, or one that is not callable; the message names the module and attribute.

    Example:
      >>> resolve_reference("json:loads", "--model")("[1]")
      [1]
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise SourceError(
            f"{flag} {reference!r} is not a reference; use package.module:function, e.g. "
            f"{flag} mymodels:build (a function in ./mymodels.py)"
        )
    # As `python -m` does, let a module in the current folder be named without installing it.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SourceError(
            f"{flag} {reference}: cannot import module {module_name!r} ({error}); check the "
            "spelling, and run from the folder that holds it or install its package"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise SourceError(
                f"{flag} {reference}: module {module_name!r} has no attribute {attribute!r}; "
                f"it defines {public[:20]}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise SourceError(
            f"{flag} {reference}: {module_name}.{attribute} is not a function (got "
            f"{type(target).__name__}); name a function that returns the object"
        )
    return target


def call_with_seed(fn: Callable[..., Any], seed: int) -> Any:
    """`fn(seed=seed)` when `fn` takes a `seed` parameter, else `fn()`."""
    try:
        takes_seed = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        takes_seed = False
    return fn(seed=seed) if takes_seed else fn()


def load_builtin(name: str | None, data_dir: str | None) -> TrainData:
    """MNIST (or the digits when it cannot be found or downloaded), scaled to [0, 1].

    Args:
      name: 'mnist' (MNIST or an error), 'digits', or None (MNIST, else the digits).
      data_dir: the `--data-dir` folder searched first for mnist.npz.

    Raises:
      FileNotFoundError: name='mnist' and MNIST cannot be had.
      ValueError: a local MNIST file is damaged.
    """
    from phalanx._src.datasets import digits, mnist

    note = None
    if name != "digits":
        try:
            splits = mnist.load_data(data_dir=data_dir)
            return _scaled("mnist", splits, 255, None)
        except FileNotFoundError:
            if name == "mnist":
                raise
            note = (
                "MNIST is not available (no local copy, and the download failed); training "
                "on the 1,797 8x8 UCI digits shipped with phalanx instead"
            )
    data = _scaled("digits", digits.load_data(), digits.MAX_PIXEL, note)
    # 1,438 training images: small batches and a larger rate give enough steps to pass 0.9
    # test accuracy in a few epochs (about 0.95 after 5 epochs on 1 or 8 replicas).
    return dataclasses.replace(data, batch_per_replica=16, base_learning_rate=1e-2)


def _scaled(name: str, splits: Any, max_pixel: int, note: str | None) -> TrainData:
    (x_train, y_train), (x_test, y_test) = splits

    def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x.astype(np.float32) / max_pixel, y.astype(np.int32)

    return TrainData(
        name,
        prepare(x_train, y_train),
        prepare(x_test, y_test),
        note,
        image_shape=tuple(x_train.shape[1:3]),
    )


def load_user(reference: str, seed: int) -> TrainData:
    """Calls the user's loader and checks it returned two splits.

    Raises:
      SourceError: a bad reference, or a result that is not `(train, test)`.
    """
    result = call_with_seed(resolve_reference(reference, "--data"), seed)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise SourceError(
            f"--data {reference} returned {type(result).__name__}"
            f"{f' of length {len(result)}' if isinstance(result, tuple | list) else ''}; "
            "return ((x_train, y_train), (x_test, y_test)) as NumPy arrays, or "
            "(train_dataset, test_dataset) with batched datasets"
        )
    train, test = result
    for split_name, split in (("train", train), ("test", test)):
        if isinstance(split, tuple | list) and not _is_xy(tuple(split)):
            raise SourceError(
                f"--data {reference}: the {split_name} split is a {type(split).__name__} of "
                f"{len(split)} item(s); give (x, y) with two arrays, or a batched dataset"
            )
    as_tuple = [tuple(s) if isinstance(s, list) else s for s in (train, test)]
    return TrainData(reference, as_tuple[0], as_tuple[1])


def build_model(name: str, data: TrainData, seed: int) -> tuple[Any, bool]:
    """The network and whether it returns logits (the built-in ones do).

    Args:
      name: 'mlp', 'cnn', or the user's 'module:factory' reference.
      data: the run's data (the built-in models take their sizes from it).
      seed: the initialisation seed.

    Raises:
      SourceError: a bad reference, or a built-in model asked for the user's own data
        (whose input size the CLI cannot know).
    """
    if name not in BUILTIN_MODELS:
        return call_with_seed(resolve_reference(name, "--model"), seed), False
    if data.image_shape is None:
        raise SourceError(
            f"--model {name} is built for the built-in images; with --data {data.name} pass "
            "your own network too: --model package.module:factory"
        )
    return _builtin(name, data.image_shape, data.num_classes, seed), True


def _builtin(name: str, image_shape: tuple[int, int], classes: int, seed: int) -> Any:
    """The first seed's MLP (hidden 128) or a two-convolution net, for (H, W) images."""
    import jax
    from flax import nnx

    rngs = nnx.Rngs(seed)
    height, width = image_shape

    class MLP(nnx.Module):
        def __init__(self) -> None:
            self.hidden = nnx.Linear(height * width, 128, rngs=rngs)
            self.out = nnx.Linear(128, classes, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x.reshape(x.shape[0], -1))))

    class CNN(nnx.Module):
        def __init__(self) -> None:
            self.conv1 = nnx.Conv(1, 32, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, (3, 3), rngs=rngs)
            self.out = nnx.Linear((height // 4) * (width // 4) * 64, classes, rngs=rngs)

        def __call__(self, x):
            x = x.reshape(x.shape[0], height, width, 1)
            x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), (2, 2))
            x = nnx.max_pool(jax.nn.relu(self.conv2(x)), (2, 2), (2, 2))
            return self.out(x.reshape(x.shape[0], -1))

    return MLP() if name == "mlp" else CNN()
