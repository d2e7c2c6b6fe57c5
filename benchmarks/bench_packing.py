"""The padding share of packed rows against padded ones, on skewed lengths (a script).

    python benchmarks/bench_packing.py                  # 5,000 sequences, rows of 512

Draws sequence lengths from a lognormal distribution (median ~60 tokens, capped at the row
length: most short, a few long, as tokenized text is), then prints the share of padding
cells with one sequence per row, with `padded_batch(32)` (each batch padded to its
longest), and with `pack_sequences` at several `num_packing_bins`, and the host time
packing takes per sequence.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from phalanx import data
from phalanx.data.experimental import pack_sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=5000)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--bins", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cap = args.length
    lengths = np.clip(rng.lognormal(np.log(60), 1.0, args.sequences).astype(int), 1, cap)
    items = [rng.integers(1, 1000, k).astype(np.int32) for k in lengths]

    def tokens(start: int = 0):
        yield from items[start:]

    print(
        f"{len(items)} sequences: median {np.median(lengths):.0f} tokens, mean "
        f"{lengths.mean():.0f}, {np.mean(lengths == cap):.1%} at the cap of {cap}"
    )
    print(f"{'layout':45s} {'padding':>8s} {'us/sequence':>12s}")
    print(f"{'one sequence per row':45s} {1 - lengths.sum() / (cap * len(items)):8.1%}")
    whole = lengths[: len(lengths) // 32 * 32].reshape(-1, 32)
    share = 1 - whole.sum() / (whole.max(1) * 32).sum()
    print(f"{'padded_batch(32), to each batch longest':45s} {share:8.1%}")
    for bins in args.bins:
        began = time.perf_counter()
        rows = list(pack_sequences(data.Dataset.from_generator(tokens), cap, bins))
        took = (time.perf_counter() - began) / len(items) * 1e6
        share = float(np.mean(np.stack([segments for _, segments, _ in rows]) == 0))
        print(f"{f'pack_sequences, num_packing_bins={bins}':45s} {share:8.1%} {took:12.1f}")


if __name__ == "__main__":
    main()
