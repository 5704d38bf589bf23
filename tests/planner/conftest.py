"""Fixtures of the planner tests."""

from __future__ import annotations

import pytest

from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def glm53() -> ModelSpec:
    return ModelSpec.preset("glm-5.3")
