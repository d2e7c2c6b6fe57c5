"""Topology records built from devices, without any hardware."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cluster_fakes import devices

from phalanx._src.cluster.platforms import choose_platform
from phalanx._src.cluster.topology import Topology, memory_bytes, topology_from_devices

GIB = 2**30


def test_tpu_pod_slice_topology():
    glob = devices(
        "tpu", "TPU v5 lite", per_process=4, processes=2, stats={"bytes_limit": 16 * GIB}
    )
    local = [d for d in glob if d.process_index == 1]
    topo = topology_from_devices(
        "tpu",
        glob,
        local,
        process_index=1,
        process_count=2,
        cluster_env="gke-tpu",
        platform_choice=choose_platform(None, ["tpu", "cpu"]),
    )
    assert (topo.platform, topo.device_kind) == ("tpu", "TPU v5 lite")
    assert (topo.process_index, topo.process_count) == (1, 2)
    assert (topo.local_device_count, topo.global_device_count) == (4, 8)
    assert topo.memory_per_device_bytes == 16 * GIB
    assert topo.multi_process
    assert topo.summary() == (
        "tpu x8 (TPU v5 lite): process 1 of 2, 4 local / 8 global devices, 16.0 GiB per device"
    )


def test_to_dict_is_json_ready_and_complete():
    topo = topology_from_devices(
        "cpu",
        devices("cpu", "cpu", 8),
        devices("cpu", "cpu", 8),
        process_index=0,
        process_count=1,
        platform_choice=choose_platform(None, ["cpu"]),
    )
    d = json.loads(json.dumps(topo.to_dict()))
    assert d["memory_per_device_bytes"] is None
    assert d["platform_choice"]["fallback"] == "No TPU or GPU found. Using CPU."
    assert d["multi_process"] is False
    assert {f.name for f in dataclasses.fields(Topology)} <= set(d)
    assert topo.summary().endswith("memory per device unknown")


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        (None, None),
        ({}, None),
        ({"bytes_in_use": 5}, None),
        ({"bytes_limit": 123}, 123),
        (RuntimeError("no"), None),
    ],
)
def test_memory_from_memory_stats(stats, expected):
    assert memory_bytes(devices("gpu", "H100", 1, stats=stats)[0]) == expected


def test_topology_is_frozen_and_needs_local_devices():
    topo = Topology("cpu", "cpu", 0, 1, 1, 1, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.platform = "tpu"
    with pytest.raises(ValueError, match="no gpu devices"):
        topology_from_devices("gpu", [], [], process_index=0, process_count=1)
