"""Every map, computed inline, in threads and in worker processes, gives the same elements:
the same structure, values, shapes and dtypes (scalars stay scalars, strings stay strings,
ragged elements keep their own shapes), over arrays and over TFRecord files."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from phalanx.data import (
    Dataset,
    FixedLenFeature,
    TFRecordDataset,
    TFRecordWriter,
    VarLenFeature,
    make_example,
    parse_single_example,
    string,
)

MODES = {
    "inline": {},
    "thread": {"num_parallel_calls": 2},
    "process": {"num_parallel_calls": 2, "workers": "process"},
}
SPEC = {
    "label": FixedLenFeature([], np.int64),
    "name": FixedLenFeature([], string),
    "box": FixedLenFeature([2], np.float32),
}


# The maps (module level: picklable for worker processes).
def scalar(x):
    return x * 3


def python_number(x):
    return int(x) + 1


def pair(x):
    return np.float32(x) / 2, np.arange(3, dtype=np.int16) + x


def nested(x):
    return {"a": np.int32(x), "b": {"c": np.full((2, 3), x, np.float64), "d": x > 2}}


def ragged(x):
    return np.arange(int(x) % 4, dtype=np.int64)  # a length of its own per element


def text(x):
    return f"word {int(x)}"


def raw(x):
    return b"\0" + bytes([int(x)]) + b"\0"  # NUL bytes, which NumPy's 'S' arrays drop


def batch_of_strings(batch):
    out = np.empty(len(batch), object)
    out[:] = [f"#{int(v)}" for v in batch]
    return {"words": out, "ids": batch}


def parse(record):
    return parse_single_example(record, SPEC)


def parse_ragged(record):
    return parse_single_example(record, {"values": VarLenFeature(np.int64)})["values"].values


def record_length(record):
    return len(record), record[:2]


def arrays(path, batch=None):
    del path  # the record file, for the sources that read it
    ds = Dataset.from_tensor_slices(np.arange(7, dtype=np.int64))
    return ds if batch is None else ds.batch(batch)


def records(path):
    return TFRecordDataset(path)


CASES = {
    "scalar": (arrays, scalar),
    "python number": (arrays, python_number),
    "tuple": (arrays, pair),
    "dict": (arrays, nested),
    "ragged": (arrays, ragged),
    "str": (arrays, text),
    "bytes": (arrays, raw),
    "after batch": (lambda path: arrays(path, 3), batch_of_strings),
    "parse": (records, parse),
    "parse ragged": (records, parse_ragged),
    "records": (records, record_length),
}


@pytest.fixture(scope="module")
def record_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("records") / "examples")
    with TFRecordWriter(path) as writer:
        for i in range(7):
            writer.write(
                make_example(
                    {
                        "label": i,
                        "name": f"n{i}",
                        "box": [float(i), -i / 2],
                        "values": list(range(i % 3)),
                    }
                )
            )
    return path


def described(leaf):
    """A leaf as what a user sees of it: NumPy values by shape, dtype and values (a scalar
    and a 0-d array alike), anything else by type and value."""
    if isinstance(leaf, np.ndarray | np.generic):
        values = leaf.tolist() if leaf.dtype.kind == "O" else leaf
        return ("array", leaf.shape, leaf.dtype.str, np.asarray(values).tolist())
    return (type(leaf).__name__, leaf)


def elements(source, fn, mode, path):
    out = list(source(path).map(fn, **MODES[mode]))
    return [jax.tree.map(described, e) for e in out]


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("case", CASES)
def test_a_map_gives_the_same_elements_inline_in_threads_and_in_processes(case, mode, record_file):
    source, fn = CASES[case]
    inline = elements(source, fn, "inline", record_file)
    assert len(inline) in (3, 7)
    assert elements(source, fn, mode, record_file) == inline


def test_the_parsed_scalars_keep_their_shape(record_file):
    # The case: a scalar feature has shape () whoever parses it.
    for mode in MODES:
        first = next(iter(records(record_file).map(parse, **MODES[mode])))
        assert np.shape(first["label"]) == () and first["name"] == b"n0", mode
