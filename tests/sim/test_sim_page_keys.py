"""The simulator's radix trees key pages on digests by default (``SimConfig.page_keys``): every figure and
record is the one exact token keys give, on a generated workload, on a cluster whose routers read the trees
(the oracle and the KV-aware router index their events) and on the head of the Mooncake trace."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from dsakv.errors import DsakvError
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.group import Group
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import MooncakeTrace

TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def _same_run(a, b) -> None:
    assert list(a.records) == list(b.records)
    assert a.summary == b.summary
    assert list(a.timeline.used_pages) == list(b.timeline.used_pages)


def test_digest_keys_give_the_token_keys_figures_with_evictions():
    chat = generate_scenario("chat", seed=0, scale=0.1)
    cfg = SimConfig(pool_tokens=40_000)  # a small pool: evictions happen
    digest = simulate(cfg, chat, check_every=40)  # the checks run the trees' integrity check
    tokens = simulate(replace(cfg, page_keys="tokens"), chat, check_every=40)
    assert cfg.page_keys == "digest" and digest.summary["evicted_tokens"] > 0 and digest.summary["hit_tokens"] > 0
    _same_run(digest, tokens)


@pytest.mark.parametrize("router", ["oracle", "kv-aware"])
def test_digest_keys_give_the_token_keys_figures_on_a_cluster(router):
    chat = generate_scenario("chat", seed=1, scale=0.1)
    cfg = SimConfig(pool_tokens=40_000, instances=3, router=router)
    digest = simulate(cfg, chat, check_every=40)
    tokens = simulate(replace(cfg, page_keys="tokens"), chat, check_every=40)
    assert digest.summary["hit_tokens"] > 0
    _same_run(digest, tokens)


def test_mtp_runs_token_keys_whatever_page_keys_says():
    cfg = SimConfig(num_speculative_tokens=1)
    assert cfg.page_keys == "digest" and cfg.radix_page_keys == "tokens"
    assert Group(cfg, build_setup(cfg)).radix.page_keys == "tokens"
    assert Group(SimConfig(), build_setup(SimConfig())).radix.page_keys == "digest"
    with pytest.raises(DsakvError, match="page_keys"):
        SimConfig(page_keys="bytes")


@pytest.mark.parametrize("source", ["generated", "shared"])
def test_digest_keys_give_the_token_keys_figures_on_the_trace_head(source):
    if source == "shared" and not TRACE.exists():
        pytest.skip(f"Mooncake trace not present at {TRACE} (shared data absent; the generated case ran)")
    if source == "shared":
        head, pool = list(itertools.islice(MooncakeTrace(TRACE), 1500)), 400_000
    else:
        head, pool = generate_scenario("chat", seed=5, scale=0.3), 40_000
    cfg = SimConfig(instances=2, pool_tokens=pool)
    digest = simulate(cfg, head)
    tokens = simulate(replace(cfg, page_keys="tokens"), head)
    assert digest.summary["hit_tokens"] > 0 and digest.summary["evicted_tokens"] > 0
    _same_run(digest, tokens)
