"""Platform choice: TPU > GPU > CPU, forced platforms, and the one-line fallback."""

from __future__ import annotations

import pytest

from phalanx._src.cluster.platforms import (
    PLATFORMS,
    choose_platform,
    normalize_platform,
    requested_platform,
)

# (requested, available) -> (chosen, fallback line or None)
CHOICES = [
    (None, ["cpu", "gpu", "tpu"], "tpu", None),
    (None, ["cpu", "gpu"], "gpu", None),
    (None, ["cpu"], "cpu", "No TPU or GPU found. Using CPU."),
    ("tpu", ["cpu", "tpu"], "tpu", None),
    ("gpu", ["cpu", "gpu", "tpu"], "gpu", None),
    ("cpu", ["cpu", "gpu", "tpu"], "cpu", None),
    (
        "tpu",
        ["cpu"],
        "cpu",
        "TPU not found (platform argument asked for it). Using CPU; available: cpu.",
    ),
    (
        "tpu",
        ["gpu", "cpu"],
        "gpu",
        "TPU not found (platform argument asked for it). Using GPU; available: gpu, cpu.",
    ),
    (
        "gpu",
        ["tpu", "cpu"],
        "tpu",
        "GPU not found (platform argument asked for it). Using TPU; available: tpu, cpu.",
    ),
]


@pytest.mark.parametrize(("requested", "available", "chosen", "fallback"), CHOICES)
def test_choice_golden(requested, available, chosen, fallback):
    choice = choose_platform(requested, available)
    assert (choice.platform, choice.fallback) == (chosen, fallback)
    assert choice.requested == requested
    assert choice.available == tuple(p for p in PLATFORMS if p in available)


def test_fallback_names_the_variable_and_jax_platforms():
    choice = choose_platform("tpu", ["cpu"], source="PHALANX_PLATFORM", jax_platforms="cpu")
    assert choice.fallback == (
        "TPU not found (PHALANX_PLATFORM=tpu asked for it; JAX_PLATFORMS=cpu). "
        "Using CPU; available: cpu."
    )
    auto = choose_platform(None, ["cpu"], source="auto", jax_platforms="cpu")
    assert auto.fallback == "No TPU or GPU found (JAX_PLATFORMS=cpu). Using CPU."


def test_fallback_is_one_line():
    for requested, available, _, _ in CHOICES:
        line = choose_platform(requested, available).fallback
        assert line is None or "\n" not in line


def test_reasons():
    assert (
        choose_platform("gpu", ["gpu"], source="PHALANX_PLATFORM").reason
        == "forced by PHALANX_PLATFORM"
    )
    assert choose_platform("cpu", ["cpu"]).reason == "forced by the platform argument"
    assert "asked for TPU, which is not available" in choose_platform("tpu", ["cpu"]).reason
    assert choose_platform(None, ["tpu"]).reason.startswith("automatic")


def test_to_dict_is_plain_values():
    d = choose_platform("tpu", ["cpu"]).to_dict()
    assert d == {
        "platform": "cpu",
        "requested": "tpu",
        "source": "argument",
        "available": ["cpu"],
        "fallback": "TPU not found (platform argument asked for it). Using CPU; available: cpu.",
        "reason": (
            "the platform argument asked for TPU, which is not available; best available instead"
        ),
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("TPU", "tpu"),
        (" gpu ", "gpu"),
        ("cuda", "gpu"),
        ("ROCm", "gpu"),
        ("cpu", "cpu"),
        ("auto", None),
        (None, None),
    ],
)
def test_normalize(value, expected):
    assert normalize_platform(value) == expected


def test_unknown_platform_error_lists_legal_values():
    with pytest.raises(ValueError) as caught:
        normalize_platform("npu", origin="PHALANX_PLATFORM")
    message = str(caught.value)
    assert "PHALANX_PLATFORM='npu'" in message
    assert all(repr(p) in message for p in ("tpu", "gpu", "cpu", "auto"))


def test_argument_beats_environment():
    env = {"PHALANX_PLATFORM": "gpu"}
    assert requested_platform("cpu", env) == ("cpu", "argument")
    assert requested_platform(None, env) == ("gpu", "PHALANX_PLATFORM")
    assert requested_platform(None, {}) == (None, "auto")
    assert requested_platform(None, {"PHALANX_PLATFORM": "  "}) == (None, "auto")
    assert requested_platform(None, {"PHALANX_PLATFORM": "auto"}) == (None, "PHALANX_PLATFORM")
    with pytest.raises(ValueError, match="PHALANX_PLATFORM='tpu2'"):
        requested_platform(None, {"PHALANX_PLATFORM": "tpu2"})


def test_no_devices_at_all_is_an_error():
    with pytest.raises(RuntimeError, match="no devices"):
        choose_platform(None, [])
    with pytest.raises(ValueError, match="available='npu'"):
        choose_platform(None, ["npu"])
