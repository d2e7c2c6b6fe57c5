"""The TFRecord format, read and written without TensorFlow.

A TFRecord file is a sequence of records, each framed as

    uint64 length (little endian) | uint32 masked CRC-32C of the length bytes
    byte data[length]             | uint32 masked CRC-32C of the data

optionally compressed as a whole (GZIP or ZLIB, as tf.io.TFRecordOptions). Every checksum is
verified; a record that is cut short or fails one raises `DataLossError` with the file and
the byte offset of the record (in the decompressed stream for GZIP and ZLIB files).
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from typing import Any, BinaryIO, NoReturn

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
COMPRESSIONS = ("", "GZIP", "ZLIB")
DEFAULT_BUFFER = 256 * 1024  # tf.data's default read buffer for TFRecord files


class DataLossError(OSError):
    """A record file is truncated or corrupt (tf.errors.DataLossError's counterpart)."""


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C of `data` (rotated right by 15 bits, plus a constant)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def compression(value: Any) -> str:
    """`compression_type` as one of "", "GZIP", "ZLIB" (None is "")."""
    name = "" if value is None else value
    if not isinstance(name, str) or name.upper() not in COMPRESSIONS:
        raise ValueError(
            f'compression_type must be None, "", "GZIP" or "ZLIB", got {value!r}; '
            'e.g. TFRecordDataset(files, compression_type="GZIP")'
        )
    return name.upper()


class _Inflate(io.RawIOBase):
    """A GZIP or ZLIB file read as its decompressed stream (gzip members may follow each
    other, as `gzip` allows)."""

    def __init__(self, raw: BinaryIO, chunk: int, wbits: int) -> None:
        self._raw, self._chunk, self._wbits = raw, chunk, wbits
        self._inflate = zlib.decompressobj(wbits)
        self._pending = b""
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            compressed = self._inflate.unconsumed_tail
            if self._inflate.eof:
                compressed = self._inflate.unused_data or self._raw.read(self._chunk)
                if not compressed:
                    return 0
                self._inflate = zlib.decompressobj(self._wbits)
            elif not compressed:
                compressed = self._raw.read(self._chunk)
                if not compressed:
                    if not self._started:
                        return 0  # an empty file holds no records
                    raise EOFError("the compressed stream ends before its end marker")
            self._started = True
            self._pending = self._inflate.decompress(compressed, len(buffer))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_records(path: str, kind: str, buffer_size: int | None) -> BinaryIO:
    """A buffered binary stream of the (decompressed) records of `path`."""
    size = DEFAULT_BUFFER if buffer_size is None else max(int(buffer_size), 1)
    raw = open(path, "rb", buffering=size)  # noqa: SIM115 (closed by the reader)
    if not kind:
        return raw
    wbits = 31 if kind == "GZIP" else 15  # 16 + 15: a gzip header and trailer
    return io.BufferedReader(_Inflate(raw, size, wbits), size)  # type: ignore[return-value]


class RecordReader:
    """Reads one file's records in order from a byte offset; `offset` is the next record's.

    Example:
      >>> reader = RecordReader("train-00000.tfrecord", "", None)
      >>> first = reader.read()   # bytes, or None at the end of the file
    """

    def __init__(self, path: str, kind: str, buffer_size: int | None, offset: int = 0) -> None:
        self.path, self.offset = path, 0
        try:
            self._file = open_records(path, kind, buffer_size)
        except FileNotFoundError:
            raise FileNotFoundError(f"record file {path!r} does not exist") from None
        self._kind = kind
        self._size = None if kind else os.fstat(self._file.fileno()).st_size
        if offset:
            self._skip_to(offset)

    def _skip_to(self, offset: int) -> None:
        if not self._kind:
            if offset > self._size:
                self._fail(offset, f"cannot resume there: the file has {self._size} bytes")
            self._file.seek(offset)
        else:  # a compressed stream is read up to the offset (it cannot seek)
            left = offset
            while left:
                left -= len(self._read(min(left, DEFAULT_BUFFER), offset - left, "stream"))
        self.offset = offset

    def _fail(self, offset: int, what: str) -> NoReturn:
        where = " of the decompressed stream" if self._kind else ""
        raise DataLossError(
            f"corrupted record at byte offset {offset}{where} in {self.path!r}: {what}. The "
            "file is truncated or damaged; re-create or re-download it, or leave it out"
        )

    def _read(self, n: int, offset: int, what: str) -> bytes:
        try:
            data = self._file.read(n)
        except (OSError, EOFError, zlib.error) as e:
            self._fail(offset, f"the stream cannot be read ({type(e).__name__}: {e})")
        if len(data) != n:
            self._fail(offset, f"truncated: expected {n} bytes of {what}, found {len(data)}")
        return data

    def _header(self) -> int | None:
        """The next record's length (checked), or None at a clean end of file."""
        start = self.offset
        try:
            header = self._file.read(12)
        except (OSError, EOFError, zlib.error) as e:
            self._fail(start, f"the stream cannot be read ({type(e).__name__}: {e})")
        if not header:
            return None
        if len(header) != 12:
            self._fail(start, f"truncated: a 12-byte header was cut to {len(header)} bytes")
        length, crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != crc:
            self._fail(start, "the checksum of the length field does not match")
        return length

    def read(self) -> bytes | None:
        """The next record's data, verified, or None at the end of the file."""
        length = self._header()
        if length is None:
            return None
        start = self.offset
        end = start + 16 + length
        if self._size is not None and end > self._size:
            self._fail(start, f"truncated: the record's {length} bytes run past the end")
        data = self._read(length, start, "data")  # two reads: no copy of a large record
        if masked_crc(data) != _CRC.unpack(self._read(4, start, "data checksum"))[0]:
            self._fail(start, "the checksum of the data does not match")
        self.offset = end
        return data

    def skip(self) -> bool:
        """Steps over the next record without reading its data (its length is still
        verified); False at the end of the file."""
        length = self._header()
        if length is None:
            return False
        start, end = self.offset, self.offset + 16 + length
        if self._size is None:  # compressed: decompressed and dropped
            self._read(length + 4, start, "data and checksum")
        elif end > self._size:
            self._fail(start, f"truncated: the record's {length} bytes run past the end")
        else:
            self._file.seek(length + 4, os.SEEK_CUR)
        self.offset = end
        return True

    def close(self) -> None:
        self._file.close()

    def __del__(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()


class TFRecordWriter:
    """Writes records to a TFRecord file that TensorFlow's readers read back.

    As tf.io.TFRecordWriter: `write(record)` appends one record (bytes), `flush()`,
    `close()`; also a context manager.

    Args:
      path: the file to create (replaced if it exists).
      compression_type: None or "" (none), "GZIP" or "ZLIB".

    Raises:
      ValueError: an unknown compression_type.
      TypeError: `write` of something that is not bytes.

    Example:
      >>> with TFRecordWriter("train-00000-of-00008.tfrecord") as writer:
      ...     writer.write(make_example({"label": [3]}))
    """

    def __init__(self, path: str | os.PathLike, compression_type: str | None = None) -> None:
        kind = compression(compression_type)
        self.path = os.fspath(path)
        self._raw = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._file: Any = self._raw
        if kind == "GZIP":
            self._file = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        self._deflate = zlib.compressobj() if kind == "ZLIB" else None

    def write(self, record: bytes) -> None:
        """Appends one record."""
        if not isinstance(record, bytes | bytearray | memoryview):
            raise TypeError(
                f"TFRecordWriter.write takes bytes, got {type(record).__name__}; serialize "
                "first, e.g. writer.write(make_example({...}))"
            )
        if self._file is None:
            raise ValueError(f"TFRecordWriter for {self.path!r} is closed; open a new one")
        data = bytes(record)
        length = struct.pack("<Q", len(data))
        framed = b"".join(
            (length, _CRC.pack(masked_crc(length)), data, _CRC.pack(masked_crc(data)))
        )
        if self._deflate is not None:
            framed = self._deflate.compress(framed)
        self._file.write(framed)

    def flush(self) -> None:
        """Pushes buffered records to the file (a ZLIB stream is flushed to a sync point)."""
        if self._deflate is not None:
            self._file.write(self._deflate.flush(zlib.Z_SYNC_FLUSH))
        self._file.flush()

    def close(self) -> None:
        """Finishes the file; writing afterwards raises ValueError."""
        if self._file is None:
            return
        if self._deflate is not None:
            self._file.write(self._deflate.flush())
        self._file.close()
        if self._raw is not self._file:
            self._raw.close()
        self._file = None

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
