"""`Strategy(devices=[...])` with TF device strings, and `cross_device_ops=` accepted."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import pytest

import phalanx
from phalanx._src.strategy import device_strings


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("/gpu:0", ("gpu", 0, None)),
        ("/GPU:1", ("gpu", 1, None)),
        ("GPU:1", ("gpu", 1, None)),
        ("/cpu:0", ("cpu", 0, None)),
        ("/device:GPU:0", ("gpu", 0, None)),
        ("/device:TPU:3", ("tpu", 3, None)),
        ("/job:localhost/replica:0/task:0/device:CPU:0", ("cpu", 0, 0)),
        ("/job:worker/replica:0/task:1/device:GPU:2", ("gpu", 2, 1)),
        ("/cpu", ("cpu", 0, None)),
    ],
)
def test_tf_device_strings_parse(spec, expected):
    assert device_strings.parse(spec) == expected


def _fake(platform, ids, process):
    return [SimpleNamespace(platform=platform, id=i, process_index=process) for i in ids]


def test_strings_name_this_process_devices_unless_a_task_is_given():
    gpus = _fake("gpu", [0, 1], 0) + _fake("gpu", [2, 3], 1)

    def lookup(platform):
        return gpus if platform == "gpu" else []

    one = device_strings.resolve_one("/gpu:1", lookup, process=1)
    assert one.id == 3  # this process's second GPU, as TF counts a machine's GPUs
    assert device_strings.resolve_one("/job:worker/task:1/device:GPU:0", lookup, 0).id == 2
    with pytest.raises(ValueError, match=r"'/gpu:2'.*2 GPU device\(s\).*indices 0\.\.1"):
        device_strings.resolve_one("/gpu:2", lookup, process=0)
    with pytest.raises(ValueError, match=r"'/tpu:0'.*no TPU"):
        device_strings.resolve_one("/tpu:0", lookup, process=0)


def test_strategy_on_cpu_strings_equals_strategy_on_those_devices():
    strategy = phalanx.Strategy(devices=["/cpu:0", "/device:CPU:1"])
    assert strategy.devices == tuple(jax.devices()[:2])
    assert strategy.num_replicas_in_sync == 2
    full = phalanx.Strategy(devices=["/job:localhost/replica:0/task:0/device:CPU:0"])
    assert full.devices == (jax.devices()[0],)
    mixed = phalanx.Strategy(devices=[jax.devices()[1], "/cpu:0"])
    assert mixed.devices == (jax.devices()[1], jax.devices()[0])


def test_absent_devices_and_bad_strings_are_refused_clearly():
    with pytest.raises(ValueError, match=r"'/gpu:0'.*no GPU.*platforms: cpu \("):
        phalanx.Strategy(devices=["/gpu:0", "/gpu:1"])
    count = jax.device_count()
    with pytest.raises(ValueError, match=rf"'/cpu:{count}'.*indices 0\.\.{count - 1}"):
        phalanx.Strategy(devices=[f"/cpu:{count}"])
    with pytest.raises(ValueError, match="not a TF device name"):
        phalanx.Strategy(devices=["gpu0"])
    with pytest.raises(ValueError, match="replica:1"):
        phalanx.Strategy(devices=["/job:worker/replica:1/task:0/device:CPU:0"])
    with pytest.raises(ValueError, match="the same device twice"):
        phalanx.Strategy(devices=["/cpu:0", "/device:CPU:0"])
    with pytest.raises(TypeError, match="got 0 of type int"):
        phalanx.Strategy(devices=[0])


def test_cross_device_ops_is_accepted_and_changes_nothing():
    ops = phalanx.NcclAllReduce()  # TF: tf.distribute.NcclAllReduce()
    strategy = phalanx.Strategy(devices=["/cpu:0", "/cpu:1"], cross_device_ops=ops)
    assert strategy.cross_device_ops is ops
    total = strategy.reduce(
        "sum", strategy.run(lambda: phalanx.get_replica_context().replica_id_in_sync_group), None
    )
    assert int(total) == 1
