"""Arrivals (issue 11): an arrival time the float clock cannot hold is an error naming the line."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.sim.config import SimConfig
from dsakv.sim.loop import MAX_ARRIVAL_S, arrival_seconds, simulate
from dsakv.workloads.traces import TraceRequest


@pytest.mark.parametrize(
    ("timestamp_ms", "time_scale"), [(1e308, 1.0), (1e308, 1e300), (1.0, 1e300), (2e13, 1.0), (float("nan"), 1.0)]
)
def test_an_arrival_beyond_the_clock_is_an_error_naming_the_line(timestamp_ms, time_scale):
    with pytest.raises(DsakvError, match="trace line 42: timestamp .* arrivals must lie within 1e\\+10 s"):
        arrival_seconds(timestamp_ms, time_scale, 42)
    assert arrival_seconds(MAX_ARRIVAL_S * 1000, 1.0, 1) == MAX_ARRIVAL_S


def test_the_loop_refuses_a_late_arrival_before_it_enters_the_clock():
    reqs = [TraceRequest(0.0, 10, 2, (1,), 1), TraceRequest(1e308, 10, 2, (2,), 2)]
    with pytest.raises(DsakvError, match="trace line 2"):
        simulate(SimConfig(step_model="constant", pool_tokens=6400), reqs)
