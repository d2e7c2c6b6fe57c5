"""MNIST in Keras's layout, from a local file or downloaded once into a cache.

Where `load_data` looks for `mnist.npz`, in order (the first that exists wins):

1. `path`, when given (a file; used as is, never downloaded to);
2. `data_dir / mnist.npz` (the `--data-dir` command-line option);
3. `$PHALANX_DATA_DIR / mnist.npz`;
4. the cache: `$XDG_CACHE_HOME/phalanx/mnist.npz`, else `~/.cache/phalanx/mnist.npz`.

If none exists it downloads Keras's copy into the cache, checks its sha256, and renames it
into place atomically (a crash never leaves a half-written file). Offline, it raises one
error that says where to put the file. Local files are checked by content (keys, shapes,
dtypes), not by hash, so any faithful copy (e.g. one rebuilt from the IDX files) works.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
FILENAME = "mnist.npz"
DATA_DIR_ENV = "PHALANX_DATA_DIR"
URL_ENV = "PHALANX_MNIST_URL"  # a mirror of URL (same file: the checksum still applies)
_DOWNLOAD_TIMEOUT_S = 60

Split = tuple[np.ndarray, np.ndarray]


def cache_dir() -> Path:
    """phalanx's cache folder: `$XDG_CACHE_HOME/phalanx`, else `~/.cache/phalanx`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phalanx"


def _candidates(data_dir: str | os.PathLike | None) -> list[Path]:
    places = []
    if data_dir is not None:
        places.append(Path(data_dir) / FILENAME)
    if os.environ.get(DATA_DIR_ENV):
        places.append(Path(os.environ[DATA_DIR_ENV]) / FILENAME)
    places.append(cache_dir() / FILENAME)
    return places


def validate(path: str | os.PathLike) -> tuple[Split, Split]:
    """Loads `path` and checks it is MNIST in Keras's layout.

    Args:
      path: an .npz file with `x_train`, `y_train`, `x_test`, `y_test`.

    Returns:
      `((x_train, y_train), (x_test, y_test))`: images uint8 (N, 28, 28), labels uint8 (N,)
      with values 0..9.

    Raises:
      ValueError: the file is not such an archive, naming what is wrong.
    """
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not an .npz archive (MNIST in Keras's layout); delete it, or point "
            f"data_dir / ${DATA_DIR_ENV} at a folder with a correct {FILENAME}"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = sorted({"x_train", "y_train", "x_test", "y_test"} - set(archive.files))
            if missing:
                raise ValueError(f"it has no {missing} (keys found: {sorted(archive.files)})")
            arrays = {k: archive[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except ValueError as err:
        raise ValueError(
            f"{path} is not MNIST in Keras's layout: {err}. Expected an .npz with x_train "
            "(N, 28, 28) uint8, y_train (N,) uint8, x_test, y_test; delete it to download "
            f"a fresh copy from {URL}"
        ) from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} cannot be read as an .npz archive ({err}); delete it") from None
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        problems = []
        if x.ndim != 3 or x.shape[1:] != (28, 28) or x.dtype != np.uint8:
            problems.append(f"x_{split} is {x.dtype}{x.shape}, expected uint8(N, 28, 28)")
        if y.ndim != 1 or y.dtype != np.uint8 or y.shape[0] != x.shape[0]:
            problems.append(f"y_{split} is {y.dtype}{y.shape}, expected uint8({x.shape[0]},)")
        elif y.size and int(y.max()) > 9:
            problems.append(f"y_{split} has label {int(y.max())}, expected 0..9")
        if problems:
            raise ValueError(
                f"{path} is not MNIST in Keras's layout: {'; '.join(problems)}. Delete it or "
                f"point data_dir / ${DATA_DIR_ENV} at a folder with a correct {FILENAME}"
            )
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def _url() -> str:
    return os.environ.get(URL_ENV) or URL


def _download(destination: Path) -> None:
    """Downloads `_url()` to `destination` through a temporary file; checks the sha256 first."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".mnist-", suffix=".part", dir=destination.parent)
    try:
        digest = hashlib.sha256()
        with (
            os.fdopen(fd, "wb") as tmp,
            urllib.request.urlopen(_url(), timeout=_DOWNLOAD_TIMEOUT_S) as response,
        ):
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                tmp.write(chunk)
        if digest.hexdigest() != SHA256:
            raise ValueError(
                f"the file downloaded from {_url()} has sha256 {digest.hexdigest()}, expected "
                f"{SHA256}; the download was corrupted or the URL changed. Download it by hand "
                f"and put it at {destination}"
            )
        os.replace(tmp_name, destination)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


def load_data(
    path: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None
) -> tuple[Split, Split]:
    """Loads MNIST as `keras.datasets.mnist.load_data()` does.

    Args:
      path: an explicit mnist.npz file; when given, only it is tried.
      data_dir: a folder holding mnist.npz (searched before `$PHALANX_DATA_DIR` and the
        cache; see the module docstring).

    Returns:
      `((x_train, y_train), (x_test, y_test))`: x uint8 (60000, 28, 28) / (10000, 28, 28)
      with values 0..255, y uint8 with values 0..9.

    Raises:
      FileNotFoundError: `path` does not exist, or no copy was found and the download failed
        (the message lists where to put the file).
      ValueError: a file was found but is not MNIST (wrong keys, shapes or dtypes), or the
        download's checksum did not match.

    Example:
      >>> (x_train, y_train), (x_test, y_test) = phalanx.datasets.mnist.load_data()
      >>> x_train.shape, y_train[:3]
      ((60000, 28, 28), array([5, 0, 4], dtype=uint8))
    """
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"MNIST file {os.fspath(path)!r} does not exist; pass the path of an existing "
                f"mnist.npz, or leave path=None to search data_dir, ${DATA_DIR_ENV} and the cache"
            )
        return validate(path)
    candidates = _candidates(data_dir)
    for candidate in candidates:
        if candidate.is_file():
            return validate(candidate)
    destination = candidates[-1]
    try:
        _download(destination)
    except OSError as err:  # URLError included: no network, DNS, refused, timeout
        searched = "\n".join(f"  {c}" for c in candidates)
        raise FileNotFoundError(
            f"MNIST is not available offline and downloading it failed ({err}).\nSearched:\n"
            f"{searched}\nDownload {_url()} (sha256 {SHA256}) on a machine with network access "
            f"and save it as one of those paths, e.g. {destination}, or pass data_dir= (or set "
            f"${DATA_DIR_ENV}) to the folder that holds {FILENAME}"
        ) from None
    return validate(destination)
