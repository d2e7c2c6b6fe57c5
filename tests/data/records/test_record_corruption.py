"""Damaged TFRecord files: every damage is a DataLossError naming the file and the record's
byte offset, and no damage ever yields a wrong element."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from record_files_helpers import write_shards

from phalanx.data import DataLossError, TFRecordDataset


def offsets(records: list[bytes]) -> list[int]:
    """Byte offset of each record in an uncompressed file."""
    out, at = [], 0
    for r in records:
        out.append(at)
        at += 16 + len(r)
    return out


def damaged(tmp_path: Path, change) -> tuple[str, list[bytes], list[int]]:
    (path,), (records,) = write_shards(tmp_path, 1, 8)
    data = bytearray(Path(path).read_bytes())
    Path(path).write_bytes(change(data))
    return path, records, offsets(records)


def read_until_error(path: str, kind: str = "") -> tuple[list[bytes], BaseException | None]:
    got: list[bytes] = []
    it = iter(TFRecordDataset(path, kind))
    try:
        for r in it:
            got.append(r)
    except DataLossError as e:
        return got, e
    return got, None


# Record 4 of the shard; its parts: length [0, 8), length CRC [8, 12), data, data CRC.
@pytest.mark.parametrize(
    ("part", "message"),
    [
        (lambda o, n: o + 3, "length"),
        (lambda o, n: o + 9, "length"),
        (lambda o, n: o + 12 + n // 2, "data"),
        (lambda o, n: o + 12 + n + 1, "data"),
    ],
    ids=["length", "length-crc", "payload", "payload-crc"],
)
def test_a_flipped_byte_names_the_file_and_the_record_offset(tmp_path, part, message):
    (path,), (records,) = write_shards(tmp_path, 1, 8)
    start = offsets(records)[4]
    data = bytearray(Path(path).read_bytes())
    data[part(start, len(records[4]))] ^= 0x40
    Path(path).write_bytes(data)
    got, error = read_until_error(path)
    assert got == records[:4]
    assert isinstance(error, DataLossError)
    text = str(error)
    assert f"byte offset {start} " in text and repr(path) in text
    assert f"checksum of the {message}" in text


@pytest.mark.parametrize("cut", [5, 12, 30, -2])
def test_a_truncated_record_names_the_file_and_the_record_offset(tmp_path, cut):
    (path,), (records,) = write_shards(tmp_path, 1, 8)
    start = offsets(records)[6]
    data = Path(path).read_bytes()
    end = start + cut if cut > 0 else start + 16 + len(records[6]) + cut
    Path(path).write_bytes(data[:end])
    got, error = read_until_error(path)
    assert got == records[:6]
    assert isinstance(error, DataLossError)
    assert f"byte offset {start} " in str(error) and "truncated" in str(error)


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_a_truncated_compressed_file_is_an_error_not_a_short_epoch(tmp_path, kind):
    (path,), (records,) = write_shards(tmp_path, 1, 8, kind)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) - 3])
    got, error = read_until_error(path, kind)
    assert isinstance(error, DataLossError), got
    assert got == records[: len(got)]
    assert "decompressed stream" in str(error)


def test_the_offset_of_a_compressed_record_is_in_the_decompressed_stream(tmp_path):
    (path,), (records,) = write_shards(tmp_path, 1, 8)
    raw = bytearray(Path(path).read_bytes())
    start = offsets(records)[2]
    raw[start + 12] ^= 1
    Path(path).write_bytes(zlib.compress(bytes(raw)))
    got, error = read_until_error(path, "ZLIB")
    assert got == records[:2]
    assert re.search(rf"byte offset {start} of the decompressed stream", str(error))


DAMAGE = st.lists(
    st.tuples(
        st.sampled_from(["flip", "cut", "insert", "delete"]),
        st.floats(0, 1, exclude_max=True),
        st.integers(1, 255),
    ),
    min_size=1,
    max_size=3,
)


def apply(data: bytes, damage: list) -> bytes:
    out = bytearray(data)
    for op, where, value in damage:
        at = int(where * len(out)) if out else 0
        if op == "flip" and out:
            out[at] ^= value
        elif op == "cut":
            del out[at:]
        elif op == "insert":
            out[at:at] = bytes([value])
        elif op == "delete" and out:
            del out[at]
    return bytes(out)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(["", "GZIP", "ZLIB"]), damage=DAMAGE)
def test_no_damage_yields_a_wrong_record(tmp_path_factory, kind, damage):
    folder = tmp_path_factory.mktemp("fuzz")
    (path,), (records,) = write_shards(folder, 1, 10, kind)
    Path(path).write_bytes(apply(Path(path).read_bytes(), damage))
    got, error = read_until_error(path, kind)
    assert got == records[: len(got)]  # what was read is right; the rest is an error
    if error is None:
        assert len(got) <= len(records)
    if kind:
        return
    # The same file through the index (a global shuffle) and by record over 2 processes
    # (skipping the other process's data): whatever comes out is an original record.
    for pipeline in (
        TFRecordDataset(path).shuffle(10, seed=0),
        TFRecordDataset(path).batch(2).process_split(1, 2).unbatch(),
    ):
        try:
            out = list(pipeline)
        except DataLossError:
            continue
        assert all(r in records for r in out)
