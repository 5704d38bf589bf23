"""One check of a usable pool (issue 11): ``plan`` and the simulator refuse the same settings, in the same words."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.plan import plan
from dsakv.sim.config import SimConfig, build_setup


@pytest.mark.parametrize(
    ("setting", "available", "reason"),
    [
        (GpuSetting(), 1, "available bytes = 1 B"),
        (GpuSetting(weights_bytes=10**15), None, "weights 1,000,000,000,000,000 B"),
        (GpuSetting(gpu_memory_bytes=10**9), None, "static 850,000,000 B"),
    ],
)
def test_plan_refuses_a_setting_without_a_pool_page_like_the_simulator(glm53, setting, available, reason):
    with pytest.raises(DsakvError, match="less than one page") as planned:
        plan(glm53, setting=setting, available_bytes=available)
    with pytest.raises(DsakvError) as simulated:
        build_setup(SimConfig(gpu=setting, available_bytes=available))
    assert str(planned.value) == str(simulated.value) and reason in str(planned.value)
