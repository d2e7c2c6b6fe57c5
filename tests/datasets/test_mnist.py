"""MNIST loading: the shared offline file, validation, the download path and the offline error.

Nothing here touches the network: downloads go to a local file:// URL, failures are stubbed.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from phalanx.datasets import mnist


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No $PHALANX_DATA_DIR, a private cache, and a download URL that must not be used."""
    monkeypatch.delenv("PHALANX_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(mnist.urllib.request, "urlopen", no_network)
    return tmp_path


def tiny_mnist(path: Path, **overrides) -> Path:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "y_train": np.arange(6, dtype=np.uint8),
        "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "y_test": np.array([7, 8, 9], np.uint8),
    }
    arrays.update(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def test_loads_the_shared_offline_file(mnist_path, isolated):
    (x_train, y_train), (x_test, y_test) = mnist.load_data(data_dir=mnist_path.parent)
    assert x_train.shape == (60000, 28, 28) and x_train.dtype == np.uint8
    assert x_test.shape == (10000, 28, 28) and y_test.shape == (10000,)
    assert y_train.dtype == np.uint8 and list(y_train[:3]) == [5, 0, 4]
    assert np.bincount(y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert x_train.mean() / 255 == pytest.approx(0.1306604762738429, rel=1e-6)


def test_search_order_data_dir_then_env_then_cache(isolated, monkeypatch):
    explicit = tiny_mnist(isolated / "explicit" / "mnist.npz", y_test=np.array([1, 1, 1], np.uint8))
    from_env = tiny_mnist(isolated / "env" / "mnist.npz", y_test=np.array([2, 2, 2], np.uint8))
    tiny_mnist(isolated / "cache" / "phalanx" / "mnist.npz", y_test=np.array([3, 3, 3], np.uint8))
    assert mnist.load_data()[1][1][0] == 3
    monkeypatch.setenv("PHALANX_DATA_DIR", str(from_env.parent))
    assert mnist.load_data()[1][1][0] == 2
    assert mnist.load_data(data_dir=explicit.parent)[1][1][0] == 1
    assert mnist.load_data(data_dir=isolated / "empty")[1][1][0] == 2  # falls through
    assert mnist.load_data(path=explicit)[1][1][0] == 1
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mnist.load_data(path=isolated / "nope.npz")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"x_train": np.zeros((6, 28, 27), np.uint8)}, r"x_train is uint8\(6, 28, 27\)"),
        ({"y_test": np.zeros(3, np.int64)}, r"y_test is int64\(3,\), expected uint8\(3,\)"),
        ({"y_train": np.full(6, 10, np.uint8)}, "label 10, expected 0..9"),
    ],
)
def test_rejects_a_wrong_file_with_a_clear_error(isolated, overrides, message):
    tiny_mnist(isolated / "data" / "mnist.npz", **overrides)
    with pytest.raises(ValueError, match=message):
        mnist.load_data(data_dir=isolated / "data")


def test_rejects_missing_keys_and_non_archives(isolated):
    path = isolated / "bad" / "mnist.npz"
    path.parent.mkdir()
    np.savez(path, images=np.zeros(3))
    with pytest.raises(ValueError, match=r"it has no \['x_test', 'x_train', 'y_test', 'y_train'\]"):
        mnist.load_data(path=path)
    path.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match=r"is not an \.npz archive"):
        mnist.load_data(path=path)


def test_downloads_into_the_cache_with_a_checked_hash(isolated, monkeypatch):
    source = tiny_mnist(isolated / "server" / "mnist.npz")
    monkeypatch.setattr(mnist, "URL", source.as_uri())
    monkeypatch.setattr(mnist, "SHA256", hashlib.sha256(source.read_bytes()).hexdigest())
    monkeypatch.setattr(mnist.urllib.request, "urlopen", urllib.request.build_opener().open)
    (x_train, y_train), _ = mnist.load_data()
    cached = isolated / "cache" / "phalanx" / "mnist.npz"
    assert cached.read_bytes() == source.read_bytes()
    assert list(y_train) == [0, 1, 2, 3, 4, 5] and x_train.shape == (6, 28, 28)
    assert [p.name for p in cached.parent.iterdir()] == ["mnist.npz"]  # no temp file left


def test_a_corrupt_download_is_rejected_and_leaves_nothing(isolated, monkeypatch):
    source = tiny_mnist(isolated / "server" / "mnist.npz")
    monkeypatch.setattr(mnist, "URL", source.as_uri())
    monkeypatch.setattr(mnist.urllib.request, "urlopen", urllib.request.build_opener().open)
    with pytest.raises(ValueError, match=r"has sha256 [0-9a-f]{64}, expected 731c5ac6"):
        mnist.load_data()
    assert list((isolated / "cache" / "phalanx").iterdir()) == []


def test_offline_and_absent_gives_one_clear_error(isolated):
    with pytest.raises(FileNotFoundError) as info:
        mnist.load_data(data_dir=isolated / "data")
    message = str(info.value)
    assert "network disabled in tests" in message
    assert str(isolated / "data" / "mnist.npz") in message
    assert str(isolated / "cache" / "phalanx" / "mnist.npz") in message
    assert mnist.URL in message and "PHALANX_DATA_DIR" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
