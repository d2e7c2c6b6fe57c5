"""Mistakes in `compile` and what it takes: names of losses, metrics, optimizers and dtype
policies, step counts, per-output configurations, and the batch-size finder's arguments."""

from __future__ import annotations

import optax
import pytest
from flax import nnx
from mistakes import Case, Tiny, assert_documented, expect, ids

import phalanx


def compile_(**kwargs):
    """`compile` on a new tiny model, with a good loss unless the case gives one."""
    model = phalanx.Model(Tiny(nnx.Rngs(0)))
    kwargs.setdefault("loss", "sparse_categorical_crossentropy")
    model.compile(**kwargs)
    return model


def tune(s, **kwargs):
    return phalanx.tune.find_batch_size(s.model, (s.x, s.y), **kwargs)


CASES = [
    Case(
        "`compile()` without a loss",
        ValueError,
        ("compile() needs a loss",),
        lambda s: compile_(loss=None),
    ),
    Case(
        "`loss='sparse_categorical_crossentropyy'`: a misspelt loss",
        ValueError,
        ("unknown loss 'sparse_categorical_crossentropyy'", "legal names are"),
        lambda s: compile_(loss="sparse_categorical_crossentropyy"),
    ),
    Case("`loss=3`", TypeError, ("got 3 of type int",), lambda s: compile_(loss=3)),
    Case(
        "`optimizer='adamm'`",
        ValueError,
        ("unknown optimizer 'adamm'", "legal names are"),
        lambda s: compile_(optimizer="adamm"),
    ),
    Case(
        "`optimizer=optax.adam`: the factory, not a transformation",
        TypeError,
        ("optimizer must be a name or an optax.GradientTransformation", "function"),
        lambda s: compile_(optimizer=optax.adam),
    ),
    Case(
        "`metrics=['acuracy']`",
        ValueError,
        ("unknown metric 'acuracy'", "legal names are"),
        lambda s: compile_(metrics=["acuracy"]),
    ),
    Case("`metrics=[3]`", TypeError, ("got 3 of type int",), lambda s: compile_(metrics=[3])),
    Case(
        "a metric named `'loss'`",
        ValueError,
        ("metric names must be unique", "'loss', 'loss'"),
        lambda s: compile_(metrics=[phalanx.metrics.Mean(name="loss")]),
    ),
    Case(
        "`metrics` per output with a single loss",
        ValueError,
        ("metrics is a dict ['a']", "single loss"),
        lambda s: compile_(metrics={"a": ["accuracy"]}),
    ),
    Case(
        "`loss_weights=[1.0, 2.0]` with a single loss",
        ValueError,
        ("loss_weights=[1.0, 2.0] needs a loss per output",),
        lambda s: compile_(loss_weights=[1.0, 2.0]),
    ),
    Case(
        "`loss_weights='equal'`",
        TypeError,
        ("'equal'", "of type str"),
        lambda s: compile_(loss={"a": "mse", "b": "mae"}, loss_weights="equal"),
    ),
    Case(
        "`loss_weights` naming an output that does not exist",
        ValueError,
        ("loss_weights keys ['c']", "['a', 'b']"),
        lambda s: compile_(loss={"a": "mse", "b": "mae"}, loss_weights={"c": 2.0}),
    ),
    Case(
        "every output's loss `None`",
        ValueError,
        ("every output's loss is None",),
        lambda s: compile_(loss={"a": None, "b": None}),
    ),
    Case(
        "two losses for one of `output_names`",
        ValueError,
        ("2 losses for 1 output names ['a']",),
        lambda s: compile_(loss=["mse", "mae"], output_names=["a"]),
    ),
    Case(
        "a loss dict whose keys are not `output_names`",
        ValueError,
        ("loss keys ['a']", "['b']"),
        lambda s: compile_(loss={"a": "mse"}, output_names=["b"]),
    ),
    Case(
        "`steps_per_execution=0`",
        ValueError,
        ("steps_per_execution must be a positive int", "got 0"),
        lambda s: compile_(steps_per_execution=0),
    ),
    Case(
        "`steps_per_execution='4'`: a string",
        ValueError,
        ("got '4'",),
        lambda s: compile_(steps_per_execution="4"),
    ),
    Case(
        "`gradient_accumulation_steps=0`",
        ValueError,
        ("gradient_accumulation_steps must be a positive int", "got 0"),
        lambda s: compile_(gradient_accumulation_steps=0),
    ),
    Case(
        "`precision='float16'`",
        ValueError,
        ("unknown dtype policy 'float16'", "mixed_float16"),
        lambda s: compile_(precision="float16"),
    ),
    Case("`precision=16`", TypeError, ("got 16 of type int",), lambda s: compile_(precision=16)),
    Case(
        "`optimizers.get('adam', momentum=0.9)`",
        TypeError,
        ("unknown argument(s) ['momentum']",),
        lambda s: phalanx.optimizers.get("adam", momentum=0.9),
    ),
    Case(
        "`optimizers.get('sgd', momentum=1.5)`",
        ValueError,
        ("momentum must be in [0, 1], got 1.5",),
        lambda s: phalanx.optimizers.get("sgd", momentum=1.5),
    ),
    Case(
        "`clipnorm` and `clipvalue` together",
        ValueError,
        ("only one of clipnorm",),
        lambda s: phalanx.optimizers.get("adam", clipnorm=1.0, clipvalue=0.5),
    ),
    Case(
        "`clipnorm=-1.0`",
        ValueError,
        ("clipnorm must be > 0, got -1.0",),
        lambda s: phalanx.optimizers.get("adam", clipnorm=-1.0),
    ),
    Case(
        "a learning rate for a ready-made optax optimizer",
        ValueError,
        ("only apply to an optimizer given by name",),
        lambda s: phalanx.optimizers.get(optax.adam(1e-3), learning_rate=0.1),
    ),
    Case(
        "`losses.get(MeanSquaredError(), reduction='sum')`",
        TypeError,
        ("keyword arguments ['reduction']",),
        lambda s: phalanx.losses.get(phalanx.losses.MeanSquaredError(), reduction="sum"),
    ),
    Case(
        "`CategoricalCrossentropy(label_smoothing=1.5)`",
        ValueError,
        ("label_smoothing must be in [0, 1], got 1.5",),
        lambda s: phalanx.losses.CategoricalCrossentropy(label_smoothing=1.5),
    ),
    Case(
        "`AUC(num_thresholds=1)`",
        ValueError,
        ("num_thresholds must be an int > 1, got 1",),
        lambda s: phalanx.metrics.AUC(num_thresholds=1),
    ),
    Case(
        "`AUC(curve='XY')`",
        ValueError,
        ("curve must be one of", "got 'XY'"),
        lambda s: phalanx.metrics.AUC(curve="XY"),
    ),
    Case(
        "`Precision(thresholds=50)`: a percentage",
        ValueError,
        ("thresholds must be floats in [0, 1], got 50",),
        lambda s: phalanx.metrics.Precision(thresholds=50),
    ),
    Case(
        "`TopKCategoricalAccuracy(k=0)`",
        ValueError,
        ("k must be a positive int, got 0",),
        lambda s: phalanx.metrics.TopKCategoricalAccuracy(k=0),
    ),
    Case(
        "`mixed_precision.Policy('bfloat16')`",
        ValueError,
        ("unknown dtype policy 'bfloat16'", "mixed_bfloat16"),
        lambda s: phalanx.mixed_precision.Policy("bfloat16"),
    ),
    Case(
        "`loss_scale_optimizer(tx, initial_scale=0)`",
        ValueError,
        ("initial_scale must be > 0, got 0",),
        lambda s: phalanx.mixed_precision.loss_scale_optimizer(optax.sgd(0.1), initial_scale=0),
    ),
    Case(
        "`model.learning_rate` of an optimizer without an injected rate",
        ValueError,
        ("no injected learning rate", "inject_hyperparams"),
        lambda s: compile_(optimizer=optax.adam(1e-3)).learning_rate,
    ),
    Case(
        "`model.learning_rate` before `compile`",
        RuntimeError,
        ("call model.compile(", "before model.learning_rate()"),
        lambda s: phalanx.Model(Tiny(nnx.Rngs(0))).learning_rate,
    ),
    Case(
        "`find_batch_size` on an uncompiled model",
        ValueError,
        ("needs a compiled model",),
        lambda s: phalanx.tune.find_batch_size(phalanx.Model(Tiny(nnx.Rngs(0))), (s.x, s.y)),
    ),
    Case(
        "`find_batch_size(headroom=90)`: a percentage",
        ValueError,
        ("headroom must be in (0, 1], got 90",),
        lambda s: tune(s, headroom=90),
    ),
    Case(
        "`find_batch_size(max_batch_size=4)` below one multiple of 8",
        ValueError,
        ("max_batch_size 4 is below one multiple (8)",),
        lambda s: tune(s, max_batch_size=4, multiple=8),
    ),
    Case(
        "`find_batch_size(dataset_size=0)`",
        ValueError,
        ("dataset_size must be a positive int, got 0",),
        lambda s: tune(s, dataset_size=0),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    expect(case, make_scene(case.checkpoint))


def test_every_case_is_in_the_docs():
    assert_documented(CASES)
