"""Shared by the record-file tests: writing small TFRecord shards with known contents."""

from __future__ import annotations

from pathlib import Path

from phalanx.data import TFRecordWriter


def record(shard: int, i: int) -> bytes:
    """Record i of shard `shard`: distinct, of varied lengths (one empty, some > 256 B)."""
    if (shard, i) == (0, 3):  # one empty record, unique
        return b""
    return f"{shard}:{i}|".encode() * (1 + (i * 37 + shard) % 90)


def write_shards(
    folder: Path, shards: int, per_shard: int | list[int], kind: str | None = None
) -> tuple[list[str], list[list[bytes]]]:
    """`shards` files of `per_shard` records each; returns (paths, records by shard)."""
    sizes = per_shard if isinstance(per_shard, list) else [per_shard] * shards
    paths, contents = [], []
    for shard, n in enumerate(sizes):
        path = str(folder / f"train-{shard:05d}-of-{shards:05d}")
        records = [record(shard, i) for i in range(n)]
        with TFRecordWriter(path, kind) as writer:
            for r in records:
                writer.write(r)
        paths.append(path)
        contents.append(records)
    return paths, contents
