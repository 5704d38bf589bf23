"""Synthetic scenarios: deterministic per seed, valid Mooncake rows, the sharing each scenario promises."""

from __future__ import annotations

import numpy as np
import pytest

from dsakv.errors import DsakvError
from dsakv.spec.layout import ceil_div
from dsakv.workloads.scenarios import SCENARIOS, generate_scenario
from dsakv.workloads.traces import MOONCAKE_BLOCK, mooncake_tokens


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_is_deterministic_for_a_seed(name):
    assert generate_scenario(name, seed=5, scale=0.3) == generate_scenario(name, seed=5, scale=0.3)
    assert generate_scenario(name, seed=5, scale=0.3) != generate_scenario(name, seed=6, scale=0.3)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_rows_satisfy_the_mooncake_invariants(name):
    reqs = generate_scenario(name, seed=1, scale=0.3)
    assert reqs and [r.timestamp_ms for r in reqs] == sorted(r.timestamp_ms for r in reqs)
    for r in reqs:
        assert r.input_length >= 1 and r.output_length >= 1
        assert len(r.hash_ids) == ceil_div(r.input_length, MOONCAKE_BLOCK)


def test_chat_turns_resend_the_previous_prompt():
    reqs = generate_scenario("chat", seed=2, scale=0.2)
    by_first = {}
    for r in reqs:
        by_first.setdefault(r.hash_ids[:13], []).append(r)
    grown = 0
    for r in reqs:
        for q in reqs:
            if q is not r and q.input_length > r.input_length and q.hash_ids[: len(r.hash_ids)] == r.hash_ids:
                a, b = mooncake_tokens(r.hash_ids, r.input_length), mooncake_tokens(q.hash_ids, q.input_length)
                assert np.array_equal(a, b[: a.size])
                grown += 1
                break
    assert grown > len(reqs) // 3


def test_system_prompts_are_shared_across_conversations():
    reqs = generate_scenario("chat", seed=0, scale=0.5)
    first_blocks = {r.hash_ids[0] for r in reqs}
    assert len(first_blocks) <= 4  # every prompt starts with one of 4 system prompts


def test_longdoc_spans_128k_to_1m_tokens():
    reqs = generate_scenario("longdoc", seed=0, scale=3)
    lengths = [r.input_length for r in reqs]
    assert min(lengths) >= 128 * 1024 - MOONCAKE_BLOCK and max(lengths) <= 1024 * 1024 + 512


@pytest.mark.parametrize("kwargs", [{"name": "nope"}, {"scale": 0}, {"seed": -1}])
def test_bad_scenario_arguments_are_rejected(kwargs):
    with pytest.raises(DsakvError):
        generate_scenario(**kwargs)
