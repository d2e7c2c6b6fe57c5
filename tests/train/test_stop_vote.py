"""The stop vote: every process acts on the same call's agreement, `lag` calls later."""

from __future__ import annotations

import pytest

import phalanx
from phalanx._src.train.checkpoint.preemption import StopVote


@pytest.mark.multidevice
@pytest.mark.parametrize("lag", [1, 3])
def test_a_request_is_decided_exactly_lag_calls_later_and_only_once(lag):
    vote = StopVote(phalanx.Strategy(), lag=lag)
    requests = [False, False, True, False, False, False, False]
    decisions = [vote.cast(r) for r in requests]
    assert decisions == [i - lag == 2 for i in range(len(requests))]
