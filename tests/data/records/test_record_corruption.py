"""Damaged TFRecord files: every damage is a DataLossError naming the file and the record's
byte offset, and no damage ever yields a wrong element."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import google_crc32c
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


def masked(data: bytes) -> int:
    """TFRecord's masked CRC-32C, written here from the format's definition."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def decompressed(raw: bytes, kind: str) -> bytes | None:
    """The stream inside a (damaged) file, or None when it does not decompress cleanly (a
    GZIP file may hold several members, as `gzip` writes and reads them)."""
    if not kind or not raw:
        return raw  # an empty compressed file holds no records
    out, rest = [], raw
    try:
        while rest:
            inflate = zlib.decompressobj(31 if kind == "GZIP" else 15)
            out.append(inflate.decompress(rest))
            if not inflate.eof:
                return None  # cut short
            rest = inflate.unused_data
    except zlib.error:
        return None
    return b"".join(out)


def parsed(stream: bytes) -> tuple[list[bytes], bool]:
    """What an exact reader gives for `stream`: the intact records before the first damage,
    and whether there is damage (a truncated or failing header, data or checksum)."""
    out, at = [], 0
    while at < len(stream):
        if len(stream) - at < 12:
            return out, True
        length, crc = struct.unpack_from("<QI", stream, at)
        if masked(stream[at : at + 8]) != crc or at + 16 + length > len(stream):
            return out, True
        data = stream[at + 12 : at + 12 + length]
        if masked(data) != struct.unpack_from("<I", stream, at + 12 + length)[0]:
            return out, True
        out.append(data)
        at += 16 + length
    return out, False


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(["", "GZIP", "ZLIB"]), damage=DAMAGE)
def test_no_damage_yields_a_wrong_record_or_passes_for_the_end_of_the_file(
    tmp_path_factory, kind, damage
):
    folder = tmp_path_factory.mktemp("fuzz")
    (path,), (records,) = write_shards(folder, 1, 10, kind)
    raw = apply(Path(path).read_bytes(), damage)
    Path(path).write_bytes(raw)
    got, error = read_until_error(path, kind)
    stream = decompressed(raw, kind)
    if stream is None:  # where the compressed stream breaks depends on the read buffers
        assert isinstance(error, DataLossError) and got == records[: len(got)]
        return
    # A damaged header, record or checksum is an error, never a short, clean file; only a
    # file cut exactly between records reads as a shorter one.
    expected, damaged = parsed(stream)
    assert got == expected
    assert (error is not None) == damaged, error
    if kind:
        return
    # The same file through the index (a global shuffle reads every record: any damage is
    # an error) and by record over 2 processes (skipping the other process's data, whose
    # damage it may not see).
    try:
        shuffled = list(TFRecordDataset(path).shuffle(10, seed=0))
    except DataLossError:
        assert damaged
    else:
        assert not damaged and sorted(shuffled) == sorted(expected)
    try:
        split = list(TFRecordDataset(path).batch(2).process_split(1, 2).unbatch())
    except DataLossError:
        return
    # Damage it does not see is in the other process's data: its own records are intact.
    assert split == (records[1::2][: len(split)] if damaged else expected[1::2])
