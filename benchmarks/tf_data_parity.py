"""phalanx.data against tf.data over random op chains: elements, cardinality, resume.

    python benchmarks/tf_data_parity.py                  # 200 pipelines, seeds 0..199
    python benchmarks/tf_data_parity.py --pipelines 1000 --first 5000 --show 5

Each pipeline starts from `Dataset.range(n)` and applies 1 to 7 ops drawn at random among
the ones that fit its elements (map, filter, take, skip, repeat, batch, padded_batch,
unbatch, rebatch, shard, enumerate, zip, concatenate, flat_map, interleave, window, scan,
take_while, unique, group_by_window, bucket_by_sequence_length, choose_from_datasets,
ignore_errors, cache, prefetch, apply, counter), built alike in phalanx and in tf.data 2.x.
A pipeline matches when both yield the same elements (values, shapes, dtypes and
structure) or both raise; where both know the cardinality, it must agree. Every phalanx
pipeline is also cut at a random element: a fresh pipeline restored from the JSON of
`get_state()` must yield the rest. The seeded random ops (`sample_from_datasets`,
`Dataset.random`) draw other values than tf.data's and are tested on their own
(tests/data/test_mix_ops.py). tests/data/test_tf_data_parity.py runs a few dozen of these
pipelines in the suite; this script runs the larger count the issue reports.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

Op = tuple[str, Callable[[Any], Any], Callable[[Any], Any], str]


class Pipeline(NamedTuple):
    names: list[str]
    phalanx: Callable[[], Any]  # builds the phalanx dataset anew
    tf: Callable[[], Any]


def _ops(P: Any, T: Any, tf: Any) -> dict[str, Callable[[np.random.Generator, str], Op | None]]:
    """Op makers: (rng, kind) -> (name, phalanx fn, tf fn, new kind), None where the op does
    not fit. Kinds: S int64 scalar, P (S, S), V vector (one length), R vector (lengths may
    differ), M matrix (rows of one length)."""
    i64 = np.int64

    def map_op(rng, kind):
        if kind == "S":
            if rng.random() < 0.3:  # ragged outputs (never empty: tf.data 2.21's unbatch
                # of a padded batch of empty vectors crashes the process)
                return (
                    "map(arange(x % 4 + 1))",
                    (lambda d: d.map(lambda x: np.arange(x % 4 + 1))),
                    (lambda d: d.map(lambda x: tf.range(x % 4 + 1))),
                    "R",
                )
            a, b = (int(v) for v in rng.integers(1, 5, 2))
            return (
                f"map(x*{a}+{b})",
                (lambda d: d.map(lambda x: x * a + b)),
                (lambda d: d.map(lambda x: x * a + b)),
                "S",
            )
        if kind == "P":
            return (
                "map(a*2+b)",
                (lambda d: d.map(lambda x, y: x * 2 + y)),
                (lambda d: d.map(lambda x, y: x * 2 + y)),
                "S",
            )
        if kind in "VR":
            if rng.random() < 0.5:
                return "map(sum)", (lambda d: d.map(np.sum)), (lambda d: d.map(tf.reduce_sum)), "S"
            return (
                "map(v*2+1)",
                (lambda d: d.map(lambda v: v * 2 + 1)),
                (lambda d: d.map(lambda v: v * 2 + 1)),
                kind,
            )
        return (
            "map(sum axis 0)",
            (lambda d: d.map(lambda m: np.sum(m, axis=0))),
            (lambda d: d.map(lambda m: tf.reduce_sum(m, axis=0))),
            "V",
        )

    def filter_op(rng, kind):
        m = int(rng.integers(2, 4))
        if kind == "S":
            return (
                f"filter(x%{m}!=1)",
                (lambda d: d.filter(lambda x: x % m != 1)),
                (lambda d: d.filter(lambda x: x % m != 1)),
                kind,
            )
        if kind == "P":
            return (
                f"filter((a+b)%{m}!=1)",
                (lambda d: d.filter(lambda x, y: (x + y) % m != 1)),
                (lambda d: d.filter(lambda x, y: (x + y) % m != 1)),
                kind,
            )
        return (
            f"filter(sum%{m}!=1)",
            (lambda d: d.filter(lambda v: np.sum(v) % m != 1)),
            (lambda d: d.filter(lambda v: tf.reduce_sum(v) % m != 1)),
            kind,
        )

    def take_op(rng, kind):
        n = int(rng.integers(0, 15))
        return f"take({n})", (lambda d: d.take(n)), (lambda d: d.take(n)), kind

    def skip_op(rng, kind):
        n = int(rng.integers(0, 6))
        return f"skip({n})", (lambda d: d.skip(n)), (lambda d: d.skip(n)), kind

    def repeat_op(rng, kind):
        if rng.random() < 0.3:
            n = int(rng.integers(1, 25))
            return (
                f"repeat().take({n})",
                (lambda d: d.repeat().take(n)),
                (lambda d: d.repeat().take(n)),
                kind,
            )
        n = int(rng.integers(1, 4))
        return f"repeat({n})", (lambda d: d.repeat(n)), (lambda d: d.repeat(n)), kind

    def batch_op(rng, kind):
        if kind not in "SV":
            return None
        n, drop = int(rng.integers(1, 6)), bool(rng.random() < 0.5)
        new = ("V" if drop else "R") if kind == "S" else "M"
        return (
            f"batch({n}, {drop})",
            (lambda d: d.batch(n, drop)),
            (lambda d: d.batch(n, drop)),
            new,
        )

    def padded_batch_op(rng, kind):
        if kind not in "SVR":
            return None
        n, drop = int(rng.integers(1, 5)), bool(rng.random() < 0.3)
        shapes = [] if kind == "S" else [None]
        new = ("V" if drop else "R") if kind == "S" else "M"
        return (
            f"padded_batch({n}, {drop})",
            (lambda d: d.padded_batch(n, shapes, -1, drop)),
            (lambda d: d.padded_batch(n, shapes, i64(-1), drop)),
            new,
        )

    def unbatch_op(rng, kind):
        if kind not in "VRM":
            return None
        return (
            "unbatch()",
            (lambda d: d.unbatch()),
            (lambda d: d.unbatch()),
            ("V" if kind == "M" else "S"),
        )

    def rebatch_op(rng, kind):
        if kind not in "VRM":
            return None
        n, drop = int(rng.integers(1, 5)), bool(rng.random() < 0.3)
        new = kind if kind == "M" else ("V" if drop else "R")
        return (
            f"rebatch({n}, {drop})",
            (lambda d: d.rebatch(n, drop)),
            (lambda d: d.rebatch(n, drop)),
            new,
        )

    def shard_op(rng, kind):
        n = int(rng.integers(1, 4))
        i = int(rng.integers(0, n))
        return f"shard({n}, {i})", (lambda d: d.shard(n, i)), (lambda d: d.shard(n, i)), kind

    def enumerate_op(rng, kind):
        if kind != "S":
            return None
        start = int(rng.integers(0, 5))
        return (
            f"enumerate({start})",
            (lambda d: d.enumerate(start)),
            (lambda d: d.enumerate(start)),
            "P",
        )

    def zip_op(rng, kind):
        if kind != "S":
            return None
        if rng.random() < 0.4:
            a, s = int(rng.integers(0, 5)), int(rng.integers(1, 3))
            return (
                f"zip(counter({a}, {s}))",
                (lambda d: P.zip(d, P.counter(a, s))),
                (lambda d: T.zip(d, T.counter(a, s))),
                "P",
            )
        n = int(rng.integers(0, 20))
        return (
            f"zip(range({n}))",
            (lambda d: P.zip(d, P.range(n))),
            (lambda d: T.zip(d, T.range(n))),
            "P",
        )

    def concatenate_op(rng, kind):
        if kind != "S":
            return None
        a, b = sorted(int(v) for v in rng.integers(0, 12, 2))
        if rng.random() < 0.5:  # a batch mapped back to scalars (issue 46's case)
            return (
                f"concatenate(range({b}).batch(2).map(sum))",
                (lambda d: d.concatenate(P.range(b).batch(2).map(np.sum))),
                (lambda d: d.concatenate(T.range(b).batch(2).map(tf.reduce_sum))),
                "S",
            )
        return (
            f"concatenate(range({a}, {b}))",
            (lambda d: d.concatenate(P.range(a, b))),
            (lambda d: d.concatenate(T.range(a, b))),
            "S",
        )

    def flat_map_op(rng, kind):
        if kind == "S":
            m = int(rng.integers(2, 5))
            return (
                f"flat_map(range(x%{m}))",
                (lambda d: d.flat_map(lambda x: P.range(x % m))),
                (lambda d: d.flat_map(lambda x: T.range(x % m))),
                "S",
            )
        if kind == "P":
            return None
        return (
            "flat_map(slices)",
            (lambda d: d.flat_map(P.from_tensor_slices)),
            (lambda d: d.flat_map(T.from_tensor_slices)),
            ("V" if kind == "M" else "S"),
        )

    def interleave_op(rng, kind):
        if kind != "S":
            return None
        m, c, b = (int(v) for v in rng.integers(1, 5, 3))
        return (
            f"interleave(range(x%{m + 1}), {c}, {b})",
            (lambda d: d.interleave(lambda x: P.range(x % (m + 1)), c, b)),
            (lambda d: d.interleave(lambda x: T.range(x % (m + 1)), c, b)),
            "S",
        )

    def window_op(rng, kind):
        if kind != "S":
            return None
        size, shift, stride = (int(v) for v in rng.integers(1, 4, 3))
        drop = bool(rng.random() < 0.5)
        return (
            f"window({size}, {shift}, {stride}, {drop}).flat_map(batch)",
            (lambda d: d.window(size, shift, stride, drop).flat_map(lambda w: w.batch(size))),
            (lambda d: d.window(size, shift, stride, drop).flat_map(lambda w: w.batch(size))),
            ("V" if drop else "R"),
        )

    def scan_op(rng, kind):
        if kind == "S":
            return (
                "scan(s+x, s*2-x)",
                (lambda d: d.scan(i64(0), lambda s, x: (s + x, s * 2 - x))),
                (lambda d: d.scan(i64(0), lambda s, x: (s + x, s * 2 - x))),
                "S",
            )
        if kind == "P":
            return (
                "scan(s+a, s-b)",
                (lambda d: d.scan(i64(1), lambda s, e: (s + e[0], s - e[1]))),
                (lambda d: d.scan(i64(1), lambda s, e: (s + e[0], s - e[1]))),
                "S",
            )
        return None

    def take_while_op(rng, kind):
        t = int(rng.integers(0, 25))
        if kind == "S":
            return (
                f"take_while(x<{t})",
                (lambda d: d.take_while(lambda x: x < t)),
                (lambda d: d.take_while(lambda x: x < t)),
                kind,
            )
        if kind == "P":
            return (
                f"take_while(a<{t})",
                (lambda d: d.take_while(lambda x, y: x < t)),
                (lambda d: d.take_while(lambda x, y: x < t)),
                kind,
            )
        return None

    def unique_op(rng, kind):
        if kind != "S":
            return None
        return "unique()", (lambda d: d.unique()), (lambda d: d.unique()), "S"

    def group_op(rng, kind):
        if kind != "S":
            return None
        m, w = int(rng.integers(2, 4)), int(rng.integers(1, 5))
        return (
            f"group_by_window(x%{m}, batch, {w})",
            (lambda d: d.group_by_window(lambda x: x % m, lambda k, g: g.batch(w), w)),
            (lambda d: d.group_by_window(lambda x: x % m, lambda k, g: g.batch(w), w)),
            "R",
        )

    def bucket_op(rng, kind):
        if kind not in "VR":
            return None
        bounds = sorted({int(v) for v in rng.integers(1, 5, 2)})
        sizes = [int(v) for v in rng.integers(1, 4, len(bounds) + 1)]
        return (
            f"bucket_by_sequence_length({bounds}, {sizes})",
            (
                lambda d: d.bucket_by_sequence_length(
                    lambda v: np.shape(v)[0], bounds, sizes, padding_values=i64(-1)
                )
            ),
            (
                lambda d: d.bucket_by_sequence_length(
                    lambda v: tf.shape(v)[0], bounds, sizes, padding_values=i64(-1)
                )
            ),
            "M",
        )

    def choose_op(rng, kind):
        if kind != "S":
            return None
        choice = rng.integers(0, 2, int(rng.integers(0, 25))).astype(np.int64)
        stop = bool(rng.random() < 0.5)
        return (
            f"choose_from_datasets({choice.tolist()}, {stop})",
            (
                lambda d: P.choose_from_datasets(
                    [d, P.range(100, 106)], P.from_tensor_slices(choice), stop
                )
            ),
            (
                lambda d: T.choose_from_datasets(
                    [d, T.range(100, 106)], T.from_tensor_slices(choice), stop
                )
            ),
            "S",
        )

    def ignore_errors_op(rng, kind):
        if kind != "S":
            return None

        def fails(x):
            if x % 5 == 3:
                raise ValueError("x % 5 == 3")
            return x

        def tf_fails(x):
            check = tf.debugging.check_numerics(1.0 / tf.cast(x % 5 - 3, tf.float64), "x%5==3")
            return x + tf.cast(check * 0.0, tf.int64)

        return (
            "map(fails on x%5==3).ignore_errors()",
            (lambda d: d.map(fails).ignore_errors()),
            (lambda d: d.map(tf_fails).ignore_errors()),
            "S",
        )

    def cache_op(rng, kind):
        return "cache()", (lambda d: d.cache()), (lambda d: d.cache()), kind

    def prefetch_op(rng, kind):
        n = int(rng.integers(1, 4))
        return f"prefetch({n})", (lambda d: d.prefetch(n)), (lambda d: d.prefetch(n)), kind

    def apply_op(rng, kind):
        n = int(rng.integers(0, 3))
        return (
            f"apply(skip({n}))",
            (lambda d: d.apply(lambda e: e.skip(n))),
            (lambda d: d.apply(lambda e: e.skip(n))),
            kind,
        )

    return {name.removesuffix("_op"): fn for name, fn in locals().items() if name.endswith("_op")}


def make_pipeline(seed: int, P: Any, T: Any, tf: Any) -> Pipeline:
    """The seed's random pipeline, as builders of the two datasets."""
    rng = np.random.default_rng(seed)
    makers = _ops(P, T, tf)
    n = int(rng.integers(0, 30))
    names, ph_fns, tf_fns, kind = [f"range({n})"], [], [], "S"
    for _ in range(int(rng.integers(1, 8))):
        names_list = sorted(makers)
        for _ in range(20):  # an op that fits this kind of element
            op = makers[names_list[int(rng.integers(len(names_list)))]](rng, kind)
            if op is not None:
                break
        name, ph_fn, tf_fn, kind = op
        names.append(name)
        ph_fns.append(ph_fn)
        tf_fns.append(tf_fn)

    def build(base: Any, fns: list) -> Callable[[], Any]:
        def make() -> Any:
            dataset = base.range(n)
            for fn in fns:
                dataset = fn(dataset)
            return dataset

        return make

    return Pipeline(names, build(P, ph_fns), build(T, tf_fns))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _elements(make: Callable[[], Any], numpy: bool) -> tuple[list | None, Any]:
    """Up to 200 elements, or (None, the error)."""
    try:
        dataset = make()
        iterator = dataset.as_numpy_iterator() if numpy else iter(dataset)
        return [e for _, e in zip(range(200), iterator, strict=False)], None
    except Exception as error:  # both raising is a match
        return None, error


class Result(NamedTuple):
    matched: bool
    both_raised: bool
    cardinality: str  # "agree", "phalanx-unknown", "tf-unknown", "differ", "n/a"
    resumed: bool | None  # None: the pipeline raised
    detail: str


def run_one(seed: int, P: Any, T: Any, tf: Any) -> Result:
    """Compares one pipeline (see the module docstring)."""
    from phalanx.data import DroppedElementsWarning

    pipeline = make_pipeline(seed, P, T, tf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedElementsWarning)
        ours, our_error = _elements(pipeline.phalanx, numpy=False)
        theirs, their_error = _elements(pipeline.tf, numpy=True)
        if ours is None or theirs is None:
            both = ours is None and theirs is None
            detail = f"phalanx: {our_error!r}" if ours is None else ""
            detail += f" tf: {type(their_error).__name__}" if theirs is None else ""
            return Result(both, both, "n/a", None, detail)
        matched = len(ours) == len(theirs) and all(map(_same, ours, theirs))
        detail = "" if matched else f"phalanx {_show(ours)} tf {_show(theirs)}"
        cardinality = _cardinality(pipeline)
        resumed = _resumes(pipeline, ours, np.random.default_rng(seed + 1))
    return Result(matched, False, cardinality, resumed, detail)


def _cardinality(pipeline: Pipeline) -> str:
    ours = pipeline.phalanx().cardinality
    theirs = int(pipeline.tf().cardinality())
    ours = -1 if ours == float("inf") else ours
    if ours == -2 and theirs == -2:
        return "both-unknown"
    if ours == -2:
        return "phalanx-unknown"
    if theirs == -2:
        return "tf-unknown"
    return "agree" if ours == theirs else f"differ ({ours} vs {theirs})"


def _resumes(pipeline: Pipeline, full: list, rng: np.random.Generator) -> bool:
    """A fresh pipeline restored from a JSON state at a random element yields the rest."""
    cut = int(rng.integers(0, len(full) + 1))
    iterator = iter(pipeline.phalanx())
    for _ in range(cut):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    restored = iter(pipeline.phalanx())
    restored.set_state(state)
    rest = [e for _, e in zip(range(len(full) - cut), restored, strict=False)]
    return len(rest) == len(full) - cut and all(map(_same, rest, full[cut:]))


def _show(elements: list) -> str:
    text = repr([np.asarray(e).tolist() if not isinstance(e, tuple) else e for e in elements])
    return text if len(text) < 300 else text[:300] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", type=int, default=200)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--show", type=int, default=10, help="mismatches to print")
    args = parser.parse_args()
    import tensorflow as tf

    from phalanx.data import Dataset

    began = time.perf_counter()
    results = {}
    for seed in range(args.first, args.first + args.pipelines):
        results[seed] = run_one(seed, Dataset, tf.data.Dataset, tf)
    seconds = time.perf_counter() - began
    matched = sum(r.matched for r in results.values())
    raised = sum(r.both_raised for r in results.values())
    resumed = [r.resumed for r in results.values() if r.resumed is not None]
    counts: dict[str, int] = {}
    for r in results.values():
        key = r.cardinality if not r.cardinality.startswith("differ") else "differ"
        counts[key] = counts.get(key, 0) + 1
    print(f"{matched} of {len(results)} pipelines match tf.data ({raised} of them raise in both)")
    print(
        f"resumed exactly from a JSON state at a random element: {sum(resumed)} of {len(resumed)}"
    )
    print(f"cardinality: {counts}")
    print(f"{seconds:.1f} s ({seconds / len(results) * 1000:.0f} ms a pipeline)")
    shown = 0
    for seed, r in results.items():
        if (not r.matched or r.resumed is False or r.cardinality.startswith("differ")) and (
            shown < args.show
        ):
            shown += 1
            names = make_pipeline(seed, Dataset, tf.data.Dataset, tf).names
            print(f"\nseed {seed}: {' -> '.join(names)}")
            print(
                f"  matched={r.matched} resumed={r.resumed} cardinality={r.cardinality} {r.detail}"
            )


if __name__ == "__main__":
    main()
