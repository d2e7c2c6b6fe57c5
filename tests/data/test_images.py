"""Images from files: list_files, read_file, PNG/JPEG decoding, image_dataset_from_directory."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from phalanx.data import (
    Dataset,
    decode_image,
    decode_jpeg,
    decode_png,
    image_dataset_from_directory,
    read_file,
)


def _pixels(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _save(path, array, fmt="PNG"):
    Image.fromarray(array.squeeze(-1) if array.shape[-1] == 1 else array).save(path, format=fmt)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_png_round_trips_exactly(tmp_path, channels):
    array = _pixels((7, 5, channels), channels)
    _save(tmp_path / "x.png", array)
    contents = read_file(str(tmp_path / "x.png"))
    assert contents.dtype == np.uint8 and contents.ndim == 1
    np.testing.assert_array_equal(decode_png(contents), array)
    np.testing.assert_array_equal(decode_image(contents.tobytes()), array)
    assert decode_png(contents, channels=3).shape == (7, 5, 3)
    assert decode_png(contents, dtype=np.uint16).dtype == np.uint16


def test_jpeg_round_trips_within_compression_error(tmp_path):
    array = np.kron(_pixels((4, 4, 3), 0), np.ones((4, 4, 1), np.uint8))  # smooth blocks
    _save(tmp_path / "x.jpg", array, "JPEG")
    decoded = decode_jpeg(read_file(tmp_path / "x.jpg"))
    assert decoded.shape == (16, 16, 3) and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - array.astype(int)).mean() < 20
    assert decode_jpeg(read_file(tmp_path / "x.jpg"), channels=1).shape == (16, 16, 1)


def test_decoders_reject_other_bytes(tmp_path):
    _save(tmp_path / "x.png", _pixels((3, 3, 3), 1))
    with pytest.raises(ValueError, match="decode_jpeg: the bytes are not JPEG"):
        decode_jpeg(read_file(tmp_path / "x.png"))
    with pytest.raises(TypeError, match="takes a file's bytes"):
        decode_png(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="channels must be 0, 1, 3 or 4"):
        decode_png(read_file(tmp_path / "x.png"), channels=2)


def test_list_files_sorts_shuffles_by_seed_and_decodes_in_a_map(tmp_path):
    arrays = {f"img{i}.png": _pixels((4, 4, 1), i) for i in range(6)}
    for name, array in arrays.items():
        _save(tmp_path / name, array)
    (tmp_path / "notes.txt").write_text("not an image")
    pattern = str(tmp_path / "*.png")
    ordered = [str(p) for p in Dataset.list_files(pattern, shuffle=False)]
    assert ordered == sorted(str(tmp_path / name) for name in arrays)
    shuffled = Dataset.list_files(pattern, seed=3)
    first, second = [str(p) for p in shuffled], [str(p) for p in shuffled]
    assert sorted(first) == ordered and first != second  # reshuffled each epoch
    assert [str(p) for p in Dataset.list_files(pattern, seed=3)] == first  # same seed
    images = Dataset.list_files(pattern, shuffle=False).map(
        lambda path: decode_png(read_file(path)), num_parallel_calls=2
    )
    batch = next(iter(images.batch(6)))
    np.testing.assert_array_equal(batch, np.stack(list(arrays.values())))
    with pytest.raises(ValueError, match="list_files found no file matching"):
        Dataset.list_files(str(tmp_path / "*.jpg"))


def _tree(tmp_path, per_class=5):
    for c, name in enumerate(["cat", "dog", "eel"]):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(per_class):
            _save(folder / f"{i}.png", np.full((6, 8, 3), 40 * c + i, np.uint8))
    return tmp_path


def test_image_dataset_from_directory_labels_from_subfolders(tmp_path, capsys):
    root = _tree(tmp_path)
    ds = image_dataset_from_directory(root, image_size=(6, 8), batch_size=4, shuffle=False)
    assert "Found 15 files belonging to 3 classes." in capsys.readouterr().out
    assert ds.class_names == ["cat", "dog", "eel"]
    images, labels = map(np.concatenate, zip(*ds, strict=True))
    assert images.shape == (15, 6, 8, 3) and images.dtype == np.float32
    assert labels.dtype == np.int32 and list(labels) == [0] * 5 + [1] * 5 + [2] * 5
    # each image's pixels say which class and file it came from
    np.testing.assert_array_equal(images[:, 0, 0, 0], 40 * labels + np.tile(np.arange(5), 3))


def test_image_dataset_from_directory_split_modes_and_resize(tmp_path, capsys):
    root = _tree(tmp_path)
    train, val = image_dataset_from_directory(
        root,
        label_mode="categorical",
        color_mode="grayscale",
        image_size=(3, 4),
        batch_size=5,
        validation_split=0.2,
        subset="both",
        seed=1,
    )
    x_train, y_train = map(np.concatenate, zip(*train, strict=True))
    x_val, _ = map(np.concatenate, zip(*val, strict=True))
    assert x_train.shape == (12, 3, 4, 1) and x_val.shape == (3, 3, 4, 1)
    assert y_train.shape == (12, 3) and set(y_train.sum(axis=1)) == {1.0}
    seen = {tuple(x[0, 0]) for x in np.concatenate([x_train, x_val])}
    assert len(seen) == 15  # the split partitions the files
    only = image_dataset_from_directory(
        root, image_size=(3, 4), validation_split=0.2, subset="validation", seed=1
    )
    np.testing.assert_array_equal(
        np.concatenate([x for x, _ in only])[..., :1].mean(), x_val.mean()
    )
    assert "Using 3 files for validation." in capsys.readouterr().out
    with pytest.raises(ValueError, match="pass validation_split and subset together"):
        image_dataset_from_directory(root, validation_split=0.2)
    with pytest.raises(ValueError, match="label_mode='binary' needs exactly 2 classes"):
        image_dataset_from_directory(root, label_mode="binary")
    with pytest.raises(ValueError, match="has no subfolders"):
        image_dataset_from_directory(root / "cat")
