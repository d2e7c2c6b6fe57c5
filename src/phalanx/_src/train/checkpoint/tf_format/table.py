"""The `.index` file of a TF checkpoint: a LevelDB-format sorted string table, read whole.

    file   := data blocks, meta-index block, index block, footer (48 bytes)
    footer := meta-index handle, index handle (varint64 offset and size each), zero
              padding to 40 bytes, magic 0xdb4775248b80fb57 (little-endian fixed64)
    block  := entries, restart offsets (fixed32 each), restart count (fixed32),
              then a trailer: compression type (1 byte), masked CRC-32C of contents + type
    entry  := shared key bytes, unshared key bytes, value size (varint32 each),
              the unshared key bytes, the value

The index block's values are the handles of the data blocks; a checkpoint's table is a few
kilobytes to megabytes, so all its entries are read at once into a dict. TF writes tables
without compression (`tensor_bundle.cc`); a compressed block is refused by name.
"""

from __future__ import annotations

import struct

import google_crc32c

from phalanx._src.data.records.wire import WireError, varint
from phalanx._src.train.checkpoint.record import CheckpointError

MAGIC = 0xDB4775248B80FB57
FOOTER = 48
_TRAILER = 5
_MASK_DELTA = 0xA282EAD8


def mask(crc: int) -> int:
    """LevelDB's and TF's masked CRC-32C (a CRC of data holding CRCs stays strong)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _handle(buf: bytes, pos: int) -> tuple[tuple[int, int], int]:
    offset, pos = varint(buf, pos)
    size, pos = varint(buf, pos)
    return (offset, size), pos


def _block(data: bytes, handle: tuple[int, int], path: str) -> bytes:
    offset, size = handle
    end = offset + size
    if end + _TRAILER > len(data):
        raise CheckpointError(
            f"{path} is truncated: a block ends at byte {end + _TRAILER}, the file has {len(data)}"
        )
    contents = data[offset:end]
    kind = data[end]
    (stored,) = struct.unpack_from("<I", data, end + 1)
    if mask(google_crc32c.extend(google_crc32c.value(contents), data[end : end + 1])) != stored:
        raise CheckpointError(
            f"{path} is damaged: the checksum of the block at byte {offset} "
            "does not match its contents"
        )
    if kind != 0:
        raise CheckpointError(
            f"{path} has a compressed block (type {kind}); TF writes checkpoint "
            "tables uncompressed, so this file is not one TF wrote"
        )
    return contents


def _entries(block: bytes, path: str) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of one block, in order (keys are prefix-compressed)."""
    if len(block) < 4:
        raise CheckpointError(f"{path} is damaged: a block of {len(block)} bytes")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise CheckpointError(f"{path} is damaged: a block claims {restarts} restart points")
    out = []
    key = b""
    pos = 0
    try:
        while pos < end:
            shared, pos = varint(block, pos)
            unshared, pos = varint(block, pos)
            size, pos = varint(block, pos)
            if shared > len(key) or pos + unshared + size > end:
                raise CheckpointError(f"{path} is damaged: an entry runs past its block")
            key = key[:shared] + block[pos : pos + unshared]
            pos += unshared
            out.append((key, block[pos : pos + size]))
            pos += size
    except WireError as error:
        raise CheckpointError(f"{path} is damaged: {error}") from None
    return out


def read_table(path: str) -> dict[bytes, bytes]:
    """Every (key, value) of the table file at `path`.

    Raises:
      CheckpointError: naming `path`, when it is not a table, is truncated, or a block's
        checksum does not match.
    """
    with open(path, "rb") as file:
        data = file.read()
    if len(data) < FOOTER:
        raise CheckpointError(
            f"{path} is not a TF checkpoint index: {len(data)} bytes, "
            f"shorter than a table's {FOOTER}-byte footer"
        )
    footer = data[-FOOTER:]
    (magic,) = struct.unpack_from("<Q", footer, FOOTER - 8)
    if magic != MAGIC:
        raise CheckpointError(
            f"{path} is not a TF checkpoint index (no table magic number at "
            "its end); pass the prefix TF saved, e.g. 'dir/ckpt-3'"
        )
    try:
        _, pos = _handle(footer, 0)  # the meta-index block: filters, which TF never writes
        index, _ = _handle(footer, pos)
    except WireError:
        raise CheckpointError(f"{path} is damaged: its footer does not decode") from None
    table: dict[bytes, bytes] = {}
    for _, value in _entries(_block(data, index, path), path):
        try:
            handle, _ = _handle(value, 0)
        except WireError:
            raise CheckpointError(f"{path} is damaged: an index entry does not decode") from None
        table.update(_entries(_block(data, handle, path), path))
    return table
