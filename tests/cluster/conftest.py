"""Fixtures for the cluster tests."""

from __future__ import annotations

import os

import pytest
from cluster_fakes import KNOWN_VARIABLES


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """os.environ without any cluster or phalanx variable (CI may itself run under SLURM)."""
    for name in KNOWN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not any(name in os.environ for name in KNOWN_VARIABLES)
    return monkeypatch
