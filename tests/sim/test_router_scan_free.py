"""Routers that do not scan every target choose exactly what the full scan chooses: the least-loaded target
from ``TargetLoads`` (a segment tree) against a scan of the loads, the KV-aware choice over the targets with a
hit plus the best of the rest against every target's score, the oracle's choice from its event-fed index
against a peek at every tree, on whole cluster runs (several instances, two DP groups, evictions) and on
random load changes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from dsakv.planner.deployment import GpuSetting
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.routing import KvAware, LeastLoaded, Oracle, least_loaded
from dsakv.sim.target_loads import TargetLoads
from dsakv.workloads.scenarios import generate_scenario


@dataclass
class CheckedLeastLoaded(LeastLoaded):
    """Least-loaded, checking each choice against a scan of every target's load."""

    choices: list[int] = field(default_factory=list)

    def choose(self, req, view) -> int:
        target = super().choose(req, view)
        assert target == least_loaded(view, range(view.num_targets))
        self.choices.append(target)
        return target


class ChecksEachChoice:
    """A router mixin: each choice is checked against the router's own full scan (``choose_by_scan``), and
    counted as won by a hit when a less loaded target was there."""

    def choose(self, req, view) -> int:
        target = super().choose(req, view)
        assert target == self.choose_by_scan(req, view)
        if view.load_tokens(target) > view.load_tokens(view.least_loaded_target()):
            self.won_by_hit += 1
        self.choices.append(target)
        return target


@dataclass
class CheckedKvAware(ChecksEachChoice, KvAware):
    """KV-aware, checking each choice against the full scan of every target's score."""

    choices: list[int] = field(default_factory=list)
    won_by_hit: int = 0  # choices of a target holding a hit while another target was less loaded


@dataclass
class CheckedOracle(ChecksEachChoice, Oracle):
    """The oracle, checking each choice against the peek at every tree."""

    choices: list[int] = field(default_factory=list)
    won_by_hit: int = 0  # choices of a target holding a hit while another target was less loaded


@pytest.fixture(scope="module")
def chat():
    return generate_scenario("chat", seed=0, scale=0.5)


def _run(cfg: SimConfig, requests, router) -> Cluster:
    cluster = Cluster(cfg, build_setup(cfg), requests, router=router)
    try:
        cluster.run(check_every=50)
    finally:
        cluster.close()
    return cluster


@pytest.mark.parametrize("dp", [1, 2])
def test_least_loaded_target_from_the_tree_is_the_scans_on_a_cluster_run(chat, dp):
    cfg = SimConfig(
        instances=3, router="least-loaded", pool_tokens=40_000, step_model="constant", gpu=GpuSetting(dp_attention=dp)
    )
    router = CheckedLeastLoaded()
    _run(cfg, chat, router)
    assert len(router.choices) == len(chat) and len(set(router.choices)) == 3 * dp


@pytest.mark.parametrize(("dp", "load_weight"), [(1, 1.0), (2, 1.0), (2, 0.0), (2, 0.05)])
def test_kv_aware_scoring_only_hit_targets_chooses_as_the_full_scan(chat, dp, load_weight):
    cfg = SimConfig(
        instances=3, router="kv-aware", pool_tokens=12_800, step_model="constant", gpu=GpuSetting(dp_attention=dp)
    )
    setup = build_setup(cfg)
    router = CheckedKvAware(setup.cell, setup.group_page_tokens, cfg.instances, load_weight=load_weight)
    cluster = _run(cfg, chat, router)
    assert len(router.choices) == len(chat) and sum(sim.counters().evicted_tokens for _, sim in cluster.targets) > 0
    assert router.won_by_hit > 0  # hits did pull requests off the least-loaded target
    if load_weight == 0:
        assert router.choices.count(0) > len(chat) // 2  # load-blind: no hit, the lowest target


@pytest.mark.parametrize(
    ("dp", "mtp", "page_keys", "host_tokens"),
    [(1, 0, "digest", None), (2, 0, "tokens", None), (2, 1, "digest", None), (1, 1, "digest", 40_000)],
    ids=["digest", "dp2-tokens", "dp2-mtp", "mtp-host-tier"],
)
def test_oracle_from_its_event_index_chooses_as_the_peek_at_every_tree(chat, dp, mtp, page_keys, host_tokens):
    cfg = SimConfig(
        instances=3,
        router="oracle",
        pool_tokens=12_800,
        step_model="constant",
        gpu=GpuSetting(dp_attention=dp),
        num_speculative_tokens=mtp,
        page_keys=page_keys,
        host_tokens=host_tokens,  # load-backs from the host tier store pages in the device trees too
    )
    setup = build_setup(cfg)
    router = CheckedOracle(
        setup.group_page_tokens, mtp > 0, setup.group_page_tokens if cfg.radix_page_keys == "digest" else 0
    )
    cluster = _run(cfg, chat, router)
    assert len(router.choices) == len(chat) and sum(sim.counters().evicted_tokens for _, sim in cluster.targets) > 0
    assert router.won_by_hit > 0  # hits did pull requests off the least-loaded target
    for t, (_, sim) in enumerate(cluster.targets):  # the index holds exactly what every tree holds
        assert router.holders.hashes_of(t) == sim.radix.page_hashes()
        assert router.holders.first_pages_of(t) <= router.holders.hashes_of(t)


def test_target_loads_track_the_least_loaded_through_random_changes():
    rng = random.Random(0)
    for targets in (1, 2, 3, 7, 16, 33):
        loads, tree = [0] * targets, TargetLoads(targets)
        for _ in range(400):
            t, tokens = rng.randrange(targets), rng.choice([-1, 1]) * rng.randrange(4)
            if loads[t] + tokens < 0:
                tokens = -tokens
            loads[t] += tokens
            tree.add(t, tokens)
            assert tree.least_loaded() == min(range(targets), key=lambda i: (loads[i], i))
            assert [tree[i] for i in range(targets)] == loads
