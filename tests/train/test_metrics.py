"""Metrics against NumPy / brute force; padding never counts; merges are exact."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx import metrics
from phalanx._src.train.api.metrics import base as metrics_base

RNG = np.random.default_rng(1)
N, C = 40, 5
LABELS = RNG.integers(0, C, N)
ONE_HOT = np.eye(C, dtype=np.float32)[LABELS]
# Rounded scores make ties (top-k) and exact threshold hits likely.
SCORES = np.round(RNG.random((N, C)), 1).astype(np.float32)
WEIGHTS = RNG.integers(0, 3, N).astype(np.float32)
BINARY_TRUE = RNG.integers(0, 2, (N, 1)).astype(np.float32)
BINARY_PRED = RNG.random((N, 1)).astype(np.float32)


def np_weighted_mean(values, weights=None):
    weights = np.ones(len(values)) if weights is None else weights
    return float((values * weights).sum() / weights.sum())


def np_top_k(labels, scores, k):
    at_label = scores[np.arange(len(labels)), labels][:, None]
    return ((scores > at_label).sum(1) < k).astype(np.float32)


# (metric factory, y_true, y_pred, per-example numpy reference values)
MEAN_CASES = {
    "sparse_categorical_accuracy": (
        metrics.SparseCategoricalAccuracy,
        LABELS,
        SCORES,
        (SCORES.argmax(1) == LABELS).astype(np.float32),
    ),
    "categorical_accuracy": (
        metrics.CategoricalAccuracy,
        ONE_HOT,
        SCORES,
        (SCORES.argmax(1) == LABELS).astype(np.float32),
    ),
    "binary_accuracy": (
        metrics.BinaryAccuracy,
        BINARY_TRUE,
        BINARY_PRED,
        ((BINARY_PRED > 0.5) == BINARY_TRUE)[:, 0].astype(np.float32),
    ),
    "sparse_top_k": (
        lambda: metrics.SparseTopKCategoricalAccuracy(k=2),
        LABELS,
        SCORES,
        np_top_k(LABELS, SCORES, 2),
    ),
    "top_k": (
        lambda: metrics.TopKCategoricalAccuracy(k=3),
        ONE_HOT,
        SCORES,
        np_top_k(LABELS, SCORES, 3),
    ),
    "accuracy": (metrics.Accuracy, LABELS, SCORES.argmax(1), (SCORES.argmax(1) == LABELS) * 1.0),
    "mse": (metrics.MeanSquaredError, ONE_HOT, SCORES, ((ONE_HOT - SCORES) ** 2).mean(1)),
    "mae": (metrics.MeanAbsoluteError, ONE_HOT, SCORES, np.abs(ONE_HOT - SCORES).mean(1)),
}


@pytest.mark.parametrize("case", sorted(MEAN_CASES))
def test_mean_metrics_match_numpy_with_and_without_weights(case):
    factory, y_true, y_pred, reference = MEAN_CASES[case]
    plain, weighted = factory(), factory()
    plain.update_state(y_true, y_pred)
    weighted.update_state(y_true, y_pred, sample_weight=WEIGHTS)
    np.testing.assert_allclose(plain.result(), np_weighted_mean(reference), rtol=1e-6)
    np.testing.assert_allclose(weighted.result(), np_weighted_mean(reference, WEIGHTS), rtol=1e-6)
    assert plain.count[...].dtype == jnp.float32


def test_mean_of_values_and_empty_result_is_zero():
    mean = metrics.Mean(name="loss")
    assert float(mean.result()) == 0.0
    mean.update_state(jnp.array([1.0, 2.0, 6.0]), sample_weight=jnp.array([1.0, 1.0, 0.0]))
    mean.update_state(jnp.array([[3.0, 5.0]]))  # trailing axes are averaged per example
    assert float(mean.result()) == pytest.approx((1 + 2 + 4) / 3)
    mean.reset_state()
    assert float(mean.count[...]) == 0.0 and float(mean.result()) == 0.0


def np_confusion(labels, preds, thresholds, weights):
    labels = labels.astype(bool).ravel()
    weights = np.broadcast_to(weights.reshape(-1, *([1] * (preds.ndim - 1))), preds.shape).ravel()
    preds = preds.ravel().astype(np.float64)
    above = preds[None, :] > np.asarray(thresholds, np.float64)[:, None]
    tp = (above & labels).astype(float) @ weights
    fp = (above & ~labels).astype(float) @ weights
    fn = (~above & labels).astype(float) @ weights
    tn = (~above & ~labels).astype(float) @ weights
    return tp, fp, fn, tn


def test_precision_and_recall_at_several_thresholds():
    thresholds = [0.25, 0.5, 0.75]
    precision = metrics.Precision(thresholds=thresholds)
    recall = metrics.Recall(thresholds=thresholds)
    for m in (precision, recall):
        m.update_state(ONE_HOT, SCORES + 0.05, sample_weight=WEIGHTS)
    tp, fp, fn, _ = np_confusion(ONE_HOT, SCORES + 0.05, thresholds, WEIGHTS)
    np.testing.assert_allclose(precision.result(), tp / (tp + fp), rtol=1e-6)
    np.testing.assert_allclose(recall.result(), tp / (tp + fn), rtol=1e-6)
    single = metrics.Precision(class_id=2)
    single.update_state(ONE_HOT, SCORES + 0.05)
    tp, fp, _, _ = np_confusion(ONE_HOT[:, 2], SCORES[:, 2] + 0.05, [0.5], np.ones(N))
    assert single.result().shape == ()
    np.testing.assert_allclose(single.result(), (tp / (tp + fp))[0], rtol=1e-6)


def np_auc(labels, preds, weights, curve, num_thresholds=200):
    """Keras's AUC by brute force: every threshold compared directly, float64."""
    n = num_thresholds
    thresholds = [-1e-7] + [(i + 1) / (n - 1) for i in range(n - 2)] + [1 + 1e-7]
    tp, fp, fn, tn = np_confusion(labels, preds, thresholds, weights)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = np.nan_to_num(tp / (tp + fn))
        if curve == "ROC":
            x, y = np.nan_to_num(fp / (fp + tn)), recall
            return float(np.sum((x[:-1] - x[1:]) * (y[:-1] + y[1:]) / 2))
        # Keras's interpolated PR-AUC.
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = np.nan_to_num(dtp / np.maximum(dp, 0))
        intercept = tp[1:] - slope * p[1:]
        ratio = np.where((p[:-1] > 0) & (p[1:] > 0), np.nan_to_num(p[:-1] / p[1:]), 1.0)
        inc = np.nan_to_num(slope * (dtp + intercept * np.log(ratio)) / (tp[1:] + fn[1:]))
        return float(inc.sum())


@pytest.mark.parametrize("curve", ["ROC", "PR"])
def test_auc_matches_brute_force_keras_formula(curve):
    labels = RNG.integers(0, 2, (300, 2)).astype(np.float32)
    # Scores correlated with labels, kept off the threshold grid (0.005 + k/199 never hits one).
    preds = np.clip(0.35 * labels + RNG.random((300, 2)) * 0.65, 0, 1).astype(np.float32)
    weights = RNG.integers(0, 3, 300).astype(np.float32)
    auc = metrics.AUC(curve=curve)
    auc.update_state(labels, preds, sample_weight=weights)
    expected = np_auc(labels, preds, weights, curve)
    assert float(auc.result()) == pytest.approx(expected, abs=1e-5)
    assert 0.6 < expected < 1.0  # the data carries signal: a vacuous 0.5 would not test much


def test_auc_roc_approximates_the_exact_rank_statistic():
    labels = RNG.integers(0, 2, 2000)
    preds = 1 / (1 + np.exp(-(labels * 1.5 + RNG.normal(size=2000))))
    pos, neg = preds[labels == 1], preds[labels == 0]
    exact = (pos[:, None] > neg[None, :]).mean()
    auc = metrics.AUC()
    auc.update_state(labels, preds)
    assert float(auc.result()) == pytest.approx(exact, abs=5e-3)
    from_logits = metrics.AUC(from_logits=True)
    from_logits.update_state(labels, np.log(preds / (1 - preds)))
    assert float(from_logits.result()) == pytest.approx(float(auc.result()), abs=1e-4)


def all_metrics():
    """One of each metric with inputs it accepts."""
    return [
        (metrics.SparseCategoricalAccuracy(), LABELS, SCORES),
        (metrics.CategoricalAccuracy(), ONE_HOT, SCORES),
        (metrics.SparseTopKCategoricalAccuracy(k=2), LABELS, SCORES),
        (metrics.TopKCategoricalAccuracy(k=2), ONE_HOT, SCORES),
        (metrics.BinaryAccuracy(), BINARY_TRUE, BINARY_PRED),
        (metrics.MeanSquaredError(), ONE_HOT, SCORES),
        (metrics.MeanAbsoluteError(), ONE_HOT, SCORES),
        (metrics.Precision(), ONE_HOT, SCORES),
        (metrics.Recall(thresholds=[0.3, 0.6]), ONE_HOT, SCORES),
        (metrics.AUC(), BINARY_TRUE, BINARY_PRED),
        (metrics.AUC(curve="PR"), ONE_HOT, SCORES),
    ]


def pad(array, rows, fill):
    padding = np.full((rows, *np.shape(array)[1:]), fill, dtype=np.asarray(array).dtype)
    return np.concatenate([array, padding])


@pytest.mark.parametrize("index", range(len(all_metrics())))
def test_weight_zero_rows_never_count(index):
    exact, y_true, y_pred = all_metrics()[index]
    padded, _, _ = all_metrics()[index]
    exact.update_state(y_true, y_pred, sample_weight=WEIGHTS)
    # Garbage in the padded rows, including NaN predictions, must not leak in.
    y_pred_garbage = pad(y_pred, 7, np.nan if y_pred.dtype.kind == "f" else 0)
    padded.update_state(
        pad(y_true, 7, 1), y_pred_garbage, sample_weight=pad(WEIGHTS, 7, 0.0).astype(np.float32)
    )
    for a, b in zip(
        jax.tree.leaves(nnx.state(exact)), jax.tree.leaves(nnx.state(padded)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(exact.result(), padded.result())


@pytest.mark.parametrize("index", range(len(all_metrics())))
def test_merge_of_two_halves_equals_the_whole(index):
    whole, y_true, y_pred = all_metrics()[index]
    first, _, _ = all_metrics()[index]
    second, _, _ = all_metrics()[index]
    whole.update_state(y_true, y_pred, sample_weight=WEIGHTS)
    first.update_state(y_true[:17], y_pred[:17], sample_weight=WEIGHTS[:17])
    second.update_state(y_true[17:], y_pred[17:], sample_weight=WEIGHTS[17:])
    merged_state = metrics.merge_states(nnx.state(first), nnx.state(second))
    first.merge(second)
    for a, b, c in zip(
        jax.tree.leaves(nnx.state(whole)),
        jax.tree.leaves(merged_state),
        jax.tree.leaves(nnx.state(first)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
        np.testing.assert_array_equal(b, c)
    np.testing.assert_allclose(whole.result(), first.result(), rtol=1e-6)


def test_update_inside_jit_through_split_and_merge():
    metric = metrics.SparseCategoricalAccuracy()
    graphdef, state = nnx.split(metric)

    @jax.jit
    def step(state, y, logits, weight):
        m = nnx.merge(graphdef, state)
        m.update_state(y, logits, sample_weight=weight)
        return nnx.state(m)

    state = step(state, LABELS[:20], SCORES[:20], WEIGHTS[:20])
    state = step(state, LABELS[20:], SCORES[20:], WEIGHTS[20:])
    nnx.update(metric, state)
    reference = (SCORES.argmax(1) == LABELS).astype(np.float32)
    np.testing.assert_allclose(metric.result(), np_weighted_mean(reference, WEIGHTS), rtol=1e-6)
    metric.reset_state()
    assert float(metric.count[...]) == 0.0


def test_replica_mask_is_applied_by_the_metric_itself(monkeypatch):
    """Inside strategy.run the metric multiplies in `current_example_mask` on its own."""
    mask = np.array([1.0] * 30 + [0.0] * 10, np.float32)
    monkeypatch.setattr(
        metrics_base, "replica_mask", lambda n: jnp.asarray(mask) if n == N else None
    )
    for (masked, y_true, y_pred), (reference, _, _) in zip(
        all_metrics(), all_metrics(), strict=True
    ):
        masked.update_state(y_true, y_pred, sample_weight=WEIGHTS)
        reference.update_state(y_true, y_pred, sample_weight=WEIGHTS * mask)
        np.testing.assert_array_equal(masked.result(), reference.result())


def test_get_resolves_keras_strings():
    scce = metrics.get("accuracy", loss="sparse_categorical_crossentropy")
    assert isinstance(scce, metrics.SparseCategoricalAccuracy) and scce.name == "accuracy"
    assert isinstance(
        metrics.get("acc", loss="categorical_crossentropy"), metrics.CategoricalAccuracy
    )
    assert isinstance(metrics.get("acc", loss="binary_crossentropy"), metrics.BinaryAccuracy)
    by_shape = metrics.get("accuracy", loss="mse", y_true_shape=(8,), y_pred_shape=(8, 10))
    assert isinstance(by_shape, metrics.SparseCategoricalAccuracy)
    assert isinstance(
        metrics.get("accuracy", y_true_shape=(8, 1), y_pred_shape=(8, 1)), metrics.BinaryAccuracy
    )
    for name, cls in [
        ("top_k_categorical_accuracy", metrics.TopKCategoricalAccuracy),
        ("precision", metrics.Precision),
        ("recall", metrics.Recall),
        ("auc", metrics.AUC),
        ("mse", metrics.MeanSquaredError),
        ("mae", metrics.MeanAbsoluteError),
    ]:
        resolved = metrics.get(name)
        assert isinstance(resolved, cls) and resolved.name == name
    fn = metrics.get(lambda y, p: jnp.abs(y - p))
    assert isinstance(fn, metrics.MeanMetricWrapper)
    with pytest.raises(ValueError, match=r"legal names are .*'auc'"):
        metrics.get("area_under_curve")
    with pytest.raises(ValueError, match="sparse_categorical_accuracy"):
        metrics.get("accuracy")


@pytest.mark.multidevice
def test_metrics_under_strategy_run_equal_one_device_with_a_partial_batch():
    """N replicas and a padded partial batch give exactly one device's numbers."""
    strategy = phalanx.Strategy()
    batches = [(LABELS[i : i + 16], SCORES[i : i + 16]) for i in range(0, N, 16)]  # 16, 16, 8
    distributed = strategy.replicate(
        [metrics.SparseCategoricalAccuracy(), metrics.AUC(), metrics.Mean()]
    )
    reference = [metrics.SparseCategoricalAccuracy(), metrics.AUC(), metrics.Mean()]

    def step(ms, batch):
        labels, scores = batch
        ms[0].update_state(labels, scores)
        ms[1].update_state(jax.nn.one_hot(labels, C), scores)
        ms[2].update_state(jnp.max(scores, axis=-1))

    for batch in strategy.experimental_distribute_dataset(batches):
        strategy.run(step, args=(distributed, batch))
    step(reference, (LABELS, SCORES))
    for got, want in zip(distributed, reference, strict=True):
        assert float(got.count[...] if hasattr(got, "count") else got.true_positives[0][...]) == (
            float(want.count[...] if hasattr(want, "count") else want.true_positives[0][...])
        )
        np.testing.assert_allclose(got.result(), want.result(), rtol=1e-6)
