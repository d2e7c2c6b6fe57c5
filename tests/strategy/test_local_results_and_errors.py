"""Per-replica values as TF gives them, and TF constructs that stay unsupported, named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import phalanx

N = jax.device_count()
ROWS = np.arange(24 * 3, dtype=np.float32).reshape(24, 3)


def _predict_rows(strategy, batch_size, compiled):
    with strategy.scope():
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    masks = []

    def predict_step(inputs):
        masks.append(phalanx.get_replica_context().mask is not None)
        return model(inputs[0])

    def distributed_predict_step(inputs):
        return strategy.run(predict_step, args=(inputs,))

    if compiled:
        distributed_predict_step = phalanx.function(distributed_predict_step)
    ds = phalanx.data.Dataset.from_tensor_slices((ROWS,)).batch(batch_size)
    sizes, rows = [], []
    for batch in strategy.experimental_distribute_dataset(ds):
        parts = strategy.experimental_local_results(distributed_predict_step(batch))
        assert len(parts) == N
        sizes.append([p.shape[0] for p in parts])
        rows.extend(parts)
    predictions = np.concatenate(rows)
    np.testing.assert_allclose(predictions, model(ROWS), rtol=1e-6)
    assert all(masks)  # the padding mask reached the step
    return sizes


@pytest.mark.multidevice
@pytest.mark.parametrize("compiled", [True, False], ids=["phalanx.function", "eager"])
def test_a_prediction_loop_collects_every_row_once(compiled):
    strategy = phalanx.Strategy()
    # 24 rows in batches of 11: 11, 11, 2, so the last batch leaves replicas past the data
    # empty (on more than 2 replicas).
    sizes = _predict_rows(strategy, 11, compiled)
    assert sum(map(sum, sizes)) == 24

    def tf_split(rows):  # tf.distribute: ceil(B / N) rows per replica, in order
        each = -(-rows // N)
        return [min(each, max(0, rows - r * each)) for r in range(N)]

    assert sizes == [tf_split(11), tf_split(11), tf_split(2)]
    if N > 2:
        assert sizes[-1][-1] == 0  # an empty value, not a copy of a real row


def test_results_that_are_not_per_example_keep_one_value_per_replica():
    strategy = phalanx.Strategy()
    (batch,) = list(strategy.experimental_distribute_dataset([(ROWS[:N],)]))
    ids = strategy.run(lambda b: phalanx.get_replica_context().replica_id_in_sync_group, (batch,))
    assert [int(v) for v in strategy.experimental_local_results(ids)] == list(range(N))


def test_local_results_inside_a_compiled_function_is_an_error_naming_the_fix():
    strategy = phalanx.Strategy()
    ds = phalanx.data.Dataset.from_tensor_slices((ROWS,)).batch(2 * N)
    batch = next(iter(strategy.experimental_distribute_dataset(ds)))

    @phalanx.function
    def predict(inputs):
        return strategy.experimental_local_results(strategy.run(lambda x: x * 2, (inputs[0],)))

    with pytest.raises(TypeError, match="Return the PerReplica value"):
        predict(batch)


def test_a_mirrored_result_stays_mirrored_out_of_a_function():
    strategy = phalanx.Strategy()
    (batch,) = list(strategy.experimental_distribute_dataset([(ROWS[: 2 * N],)]))

    @phalanx.function
    def total(inputs):
        return strategy.run(
            lambda x: phalanx.get_replica_context().all_reduce("sum", x.sum()), (inputs[0],)
        )

    out = total(batch)
    assert float(strategy.reduce("sum", out, axis=None)) == pytest.approx(N * ROWS[: 2 * N].sum())


def test_jax_jit_around_a_stateful_step_names_phalanx_function():
    strategy = phalanx.Strategy()
    with strategy.scope():
        counter = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    (batch,) = list(strategy.experimental_distribute_dataset([(ROWS[: 2 * N],)]))

    @jax.jit
    def step(inputs):
        return strategy.run(lambda x: counter(x), (inputs[0],)).stacked

    with pytest.raises(ValueError, match=r"@phalanx.function instead of @jax.jit"):
        step(batch)


def test_python_control_flow_on_a_traced_value_names_lax_cond():
    @phalanx.function
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(TypeError, match=r"jax.lax.cond"):
        f(jnp.ones(3))


def test_tf_function_options():
    assert float(phalanx.function(lambda x: x + 1, input_signature=[None])(jnp.ones(()))) == 2
    with pytest.raises(TypeError, match="always compiles with XLA"):
        phalanx.function(jit_compile=False)(lambda x: x)


def test_a_function_compiles_once_per_signature():
    calls = []

    @phalanx.function(jit_compile=True)
    def f(x, scale):
        calls.append(1)
        return x * scale

    assert float(f(jnp.ones(()), 2.0)) == 2.0
    assert float(f(jnp.ones(()) * 3, 2.0)) == 6.0
    assert len(calls) == 1
    f(jnp.ones((2,)), 2.0)  # a new shape compiles anew, as tf.function retraces
    f(jnp.ones(()), 3.0)  # so does a new Python value
    assert len(calls) == 3


def test_functools_partial_arguments_are_arguments_and_a_hidden_object_is_named():
    import functools

    strategy = phalanx.Strategy()
    with strategy.scope():
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    (batch,) = list(strategy.experimental_distribute_dataset([(ROWS[:N],)]))
    out = strategy.run(functools.partial(lambda m, inputs: m(inputs[0]), model), args=(batch,))
    np.testing.assert_allclose(
        np.concatenate(strategy.experimental_local_results(out)), model(ROWS[:N]), rtol=1e-6
    )

    predict = functools.partial(lambda m, x: m(x), model)  # called by the step: hidden
    with pytest.raises(TypeError, match=r"functools.partial.*pass it as an argument"):
        strategy.run(lambda inputs: predict(inputs[0]), args=(batch,))


def test_a_tape_style_gradient_of_no_arguments_names_value_and_grad():
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    (batch,) = list(strategy.experimental_distribute_dataset([(ROWS[:N],)]))

    def step(inputs):
        # TF: with tf.GradientTape() as tape: loss = ...; tape.gradient(loss, variables)
        return nnx.grad(lambda: model(inputs[0]).sum())()

    with pytest.raises(TypeError, match=r"tf.GradientTape.*nnx.value_and_grad\(loss_fn\)"):
        strategy.run(step, args=(batch,))
