"""Strings and bytes on the host: legal in every op before the device, refused at the device.

An element's string leaf is a Python `str` or `bytes` (the type given), a batch of them a
NumPy object array (as tf.data's `as_numpy_iterator()` gives a string tensor). Only where
batches go to the devices (fit / evaluate / predict, `experimental_distribute_dataset`,
`DevicePrefetcher` with a `put_fn`, `as_batches`) does a string leaf raise, naming its path.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx.data import Dataset, DevicePrefetcher, TensorSpec, as_batches

WORDS = ["a", "bb", "ccc", "dddd", "eeeee"]
VOCAB = {w: i + 1 for i, w in enumerate(WORDS)}  # 0: out of vocabulary


def pairs() -> Dataset:
    """(word, number) elements: a string leaf beside a numeric one."""
    return Dataset.from_tensor_slices((np.array(WORDS), np.arange(5)))


def words() -> Dataset:
    return Dataset.from_tensor_slices(WORDS)


def obj(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def same(got, want) -> None:
    """Equal structures with equal leaves, strings compared by type and value."""
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree, (got, want)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        if isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype, (g, w)
            assert g.shape == w.shape and all(
                type(a) is type(b) and a == b for a, b in zip(g.flat, w.flat, strict=True)
            ), (g, w)
        else:
            assert type(g) is type(w) and g == w, (g, w)


# (name, pipeline, what one epoch yields)
OPS = [
    ("list of str", words, WORDS),
    ("NumPy U array", lambda: Dataset.from_tensor_slices(np.array(WORDS)), WORDS),
    (
        "list of bytes keeps trailing NULs",
        lambda: Dataset.from_tensor_slices([b"x\x00", b"\xff\xd8\x00"]),
        [b"x\x00", b"\xff\xd8\x00"],
    ),
    ("NumPy S array", lambda: Dataset.from_tensor_slices(np.array([b"p", b"qq"])), [b"p", b"qq"]),
    ("object array", lambda: Dataset.from_tensor_slices(obj(["x", "yy"])), ["x", "yy"]),
    (
        "nested in a tuple and a dict",
        lambda: Dataset.from_tensor_slices(({"text": ["a", "b"], "n": [1, 2]}, [b"0", b"1"])),
        [({"n": np.int64(1), "text": "a"}, b"0"), ({"n": np.int64(2), "text": "b"}, b"1")],
    ),
    ("from_tensors", lambda: Dataset.from_tensors("one"), ["one"]),
    (
        "2-D rows of strings",
        lambda: Dataset.from_tensor_slices([["a", "b"], ["c", "d"]]),
        [obj(["a", "b"]), obj(["c", "d"])],
    ),
    ("map str -> str", lambda: words().map(lambda w: w.upper()), [w.upper() for w in WORDS]),
    (
        "map through a vocabulary",
        lambda: words().map(lambda w: np.int32(VOCAB.get(w, 0))),
        [np.int32(i) for i in range(1, 6)],
    ),
    (
        "filter on a string",
        lambda: words().filter(lambda w: len(w) % 2 == 1),
        ["a", "ccc", "eeeee"],
    ),
    (
        "shuffle: the order of the same shuffle over numbers",
        lambda: pairs().shuffle(5, seed=3, reshuffle_each_iteration=False),
        [
            (WORDS[i], np.int64(i))
            for i in Dataset.range(5).shuffle(5, seed=3, reshuffle_each_iteration=False)
        ],
    ),
    (
        "batch",
        lambda: pairs().batch(2),
        [
            (obj(["a", "bb"]), np.array([0, 1])),
            (obj(["ccc", "dddd"]), np.array([2, 3])),
            (obj(["eeeee"]), np.array([4])),
        ],
    ),
    (
        "batch(drop_remainder) after filter (streaming)",
        lambda: words().filter(lambda w: w != "bb").batch(2, drop_remainder=True),
        [obj(["a", "ccc"]), obj(["dddd", "eeeee"])],
    ),
    ("map over a batch", lambda: words().batch(5).map(lambda b: b[::-1]), [obj(WORDS[::-1])]),
    ("cache", lambda: words().map(lambda w: w * 2).cache(), [w * 2 for w in WORDS]),
    (
        "zip",
        lambda: Dataset.zip(words(), Dataset.range(5)),
        [(w, np.int64(i)) for i, w in enumerate(WORDS)],
    ),
    ("take", lambda: words().take(2), WORDS[:2]),
    ("skip", lambda: words().skip(3), WORDS[3:]),
    ("repeat", lambda: words().take(2).repeat(2), WORDS[:2] * 2),
    ("concatenate", lambda: words().take(1).concatenate(words().skip(4)), ["a", "eeeee"]),
    ("enumerate", lambda: words().take(2).enumerate(), [(np.int64(0), "a"), (np.int64(1), "bb")]),
    ("unbatch", lambda: words().batch(2).unbatch(), WORDS),
    (
        "padded_batch pads with ''",
        lambda: Dataset.from_generator(lambda: iter(["x y", "z"])).map(str.split).padded_batch(2),
        [np.array([["x", "y"], ["z", ""]], dtype=object)],
    ),
    (
        "padded_batch of bytes pads with b''",
        lambda: (
            Dataset.from_tensor_slices([b"a b", b"c"])
            .filter(lambda b: True)
            .map(bytes.split)
            .padded_batch(2)
        ),
        [np.array([[b"a", b"b"], [b"c", b""]], dtype=object)],
    ),
    (
        "from_generator with a string signature",
        lambda: Dataset.from_generator(
            lambda: iter([("s", 1)]),
            output_signature=(TensorSpec((), str), TensorSpec((), np.int64)),
        ),
        [("s", np.array(1))],
    ),
    (
        "interleave",
        lambda: Dataset.from_tensor_slices(["a b", "c d"]).interleave(
            lambda s: Dataset.from_tensor_slices(s.split()), cycle_length=2
        ),
        ["a", "c", "b", "d"],
    ),
    (
        "NumPy str_ scalars come out as Python str",
        lambda: Dataset.from_generator(lambda: iter(np.array(["u", "v"]))).map(lambda s: s),
        ["u", "v"],
    ),
    (
        "flat_map",
        lambda: Dataset.from_tensor_slices(["a b", "c"]).flat_map(
            lambda s: Dataset.from_tensor_slices(s.split())
        ),
        ["a", "b", "c"],
    ),
]


@pytest.mark.parametrize(("name", "build", "want"), OPS, ids=[o[0] for o in OPS])
def test_strings_pass_through_every_host_op(name, build, want):
    dataset = build()
    got = list(dataset)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        same(g, w)
    # A second epoch (and a restored iterator) gives the same elements.
    for g, w in zip(list(dataset), want, strict=True):
        same(g, w)


def test_cache_keeps_strings_longer_than_the_first_ones():
    # A fixed-width store (NumPy <U1, sized by the first element) would cut "bbbbbb" to "b".
    calls = []

    def grow(w):
        calls.append(w)
        return w * 6 if w == "b" else w

    cached = Dataset.from_tensor_slices(["a", "b"]).map(grow).cache()
    assert list(cached) == ["a", "bbbbbb"]
    assert list(cached) == ["a", "bbbbbb"] and calls == ["a", "b"]


def test_iterator_state_restores_a_string_pipeline():
    dataset = words().shuffle(5, seed=1).filter(lambda w: w != "ccc").batch(2)
    it = iter(dataset)
    next(it)
    state = it.get_state()
    rest = [list(b) for b in it]
    restored = iter(dataset)
    restored.set_state(state)
    assert [list(b) for b in restored] == rest


def test_element_spec_of_strings_has_dtype_object():
    assert words().element_spec == TensorSpec((), object)
    assert pairs().batch(2).element_spec == (
        TensorSpec((None,), object),
        TensorSpec((None,), np.int64),
    )
    # str, bytes and NumPy's U/S all name the one string dtype, as tf.string does.
    assert TensorSpec((), str) == TensorSpec((), bytes) == TensorSpec((), np.dtype("S3"))


# -- the device boundary -----------------------------------------------------------------

STRING_FIX = "Turn it into numbers in `map` first, e.g. with a StringLookup or a vocabulary"


def text_batches() -> Dataset:
    """({'text': str, 'x': 4 floats}, label) elements, batched: a model-shaped pipeline whose
    text leaf was never turned into numbers."""
    x = np.zeros((4, 4), np.float32)
    return Dataset.from_tensor_slices(({"text": WORDS[:4], "x": x}, np.arange(4) % 3)).batch(2)


class Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.out = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, inputs):
        if isinstance(inputs, dict):  # reads the text leaf: its trace would fail on strings
            return self.out(inputs["x"] + inputs["text"][:, None])
        return self.out(inputs)


@pytest.fixture(scope="module")
def model() -> phalanx.Model:
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(Tiny(nnx.Rngs(0)))
        model.compile(
            optimizer=phalanx.optimizers.get("sgd", learning_rate=0.1),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _raises_naming(path: str, error: type[Exception] = TypeError):
    return pytest.raises(error, match=re.escape(path) + r" holds .*str.*" + re.escape(STRING_FIX))


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(text_batches, id="in-memory dataset"),
        pytest.param(lambda: text_batches().map(lambda f, y: (f, y)), id="mapped dataset"),
        pytest.param(lambda: list(text_batches()), id="a list of batches"),
    ],
)
@pytest.mark.parametrize("phase", ["fit", "evaluate", "predict"])
def test_a_string_leaf_reaching_the_model_is_named(model, source, phase):
    data = source()
    call = {
        "fit": lambda: model.fit(data, epochs=1, verbose=0),
        "evaluate": lambda: model.evaluate(data, verbose=0),
        "predict": lambda: model.predict(data, verbose=0),
    }[phase]
    # A list of batches is named by the Keras names of its (x, y) members.
    path = "x['text']" if isinstance(data, list) else "element[0]['text']"
    with _raises_naming(path):
        call()


def test_string_arrays_given_to_fit_are_named_x(model):
    with _raises_naming("x"):
        model.fit(np.array(WORDS[:4]), np.arange(4), verbose=0)


def test_fit_trains_once_map_turns_the_strings_into_numbers(model):
    def encode(features, label):
        ids = np.array([VOCAB[w] for w in features["text"]], np.float32)
        return features["x"] + ids[:, None], label

    history = model.fit(text_batches().map(encode), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_experimental_distribute_dataset_names_the_string_leaf():
    strategy = phalanx.Strategy()
    distributed = strategy.experimental_distribute_dataset(text_batches())
    with _raises_naming("element[0]['text']"):
        next(iter(distributed))
    numbers = strategy.experimental_distribute_dataset(text_batches().map(lambda f, y: (f["x"], y)))
    x, _ = next(iter(numbers))
    assert isinstance(x, jax.Array) and x.shape[1:] == (4,)  # padded to the replicas


def test_device_prefetcher_checks_before_put_fn():
    put = []
    with (
        DevicePrefetcher(text_batches(), put_fn=put.append) as batches,
        _raises_naming("element[0]['text']"),
    ):
        next(batches)
    assert put == []
    # Without a put_fn it is a host prefetcher: strings pass.
    with DevicePrefetcher(words().batch(5)) as batches:
        same(next(batches), obj(WORDS))


def test_as_batches_refuses_strings_in_arrays_and_foreign_batches():
    with pytest.raises(TypeError, match=r"^the input arrays: y holds .*str"):
        as_batches((np.zeros((2, 4)), np.array(["a", "b"])), batch_size=2)
    with pytest.raises(TypeError, match=r"^batch 0 of the list: y holds .*bytes"):
        list(as_batches([(np.zeros(2), [b"a", b"b"])]))


def test_ragged_rows_keep_their_error_at_the_boundary():
    ragged = obj([np.zeros(2, np.float32), np.zeros(3, np.float32)])
    dataset = Dataset.from_tensor_slices((ragged, np.arange(2))).batch(2)
    batch = next(iter(dataset))  # legal on the host
    assert batch[0].dtype == object and batch[0][1].shape == (3,)
    strategy = phalanx.Strategy()
    with pytest.raises(ValueError, match=r"element\[0\] is ragged: .*\(2,\), \(3,\).*pad the rows"):
        next(iter(strategy.experimental_distribute_dataset(dataset)))
    # Ragged Python lists are still refused when the dataset is built, as tf.data does.
    with pytest.raises(ValueError, match=r"tensors is ragged"):
        Dataset.from_tensor_slices([[1.0, 2.0], [3.0]])


def _echo(batch):
    return batch  # module level: picklable for worker processes


def test_strings_from_a_process_map_are_the_threads_strings():
    # Shared memory cannot carry an object array (its pointers belong to the worker): the
    # strings travel pickled, and come back as the threads give them.
    processes = list(words().batch(2).map(_echo, num_parallel_calls=2, workers="process"))
    threads = list(words().batch(2).map(_echo, num_parallel_calls=2))
    assert len(processes) == len(threads)
    for got, want in zip(processes, threads, strict=True):
        same(got, want)
    same(threads[0], obj(WORDS[:2]))
