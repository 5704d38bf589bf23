"""The KV-aware router fed over real ZMQ sockets on loopback (``SimConfig.kv_events_endpoint``) routes exactly as in
process: the same records, summary and index, also when the subscribers miss batches and recover them by
replay; a loss that cannot be recovered, or a drain that cannot finish, is a ``DsakvError``, never a hang or a
silently different run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsakv.cache.events import AllCleared
from dsakv.errors import DsakvError
from dsakv.kvevents.endpoint import instance_endpoint
from dsakv.kvevents.index import PrefixIndex
from dsakv.kvevents.zmq_feed import ZmqEventFeed
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.workloads.scenarios import generate_scenario

LOOPBACK = "tcp://127.0.0.1:*"  # every publisher binds a free port
# 3 instances of 2 DP groups, a pool small enough that the trees evict (removals cross the wire too)
BASE = SimConfig(
    instances=3, router="kv-aware", pool_tokens=12_800, step_model="constant", gpu=GpuSetting(dp_attention=2)
)


@pytest.fixture(scope="module")
def chat():
    return generate_scenario("chat", seed=0, scale=0.3)


def run_cluster(cfg: SimConfig, requests, drop_on_pub=None) -> tuple[Cluster, object]:
    """Run the cluster, make its router's index current and close its sockets; (cluster, result)."""
    cluster = Cluster(cfg, build_setup(cfg), requests)
    try:
        if drop_on_pub is not None:
            for pub in cluster.router.feed.publishers:
                pub.drop_on_pub = drop_on_pub
        result = cluster.result(cluster.run(check_every=25))
        cluster.router.feed.sync()
    finally:
        cluster.close()
    return cluster, result


def index_of(cluster: Cluster) -> dict:
    index = cluster.router.index
    index.check_integrity()
    return {w: index.hashes_of(w) for w in index.workers}


@pytest.fixture(scope="module")
def in_process(chat):
    return run_cluster(BASE, chat)


def assert_same_run(over_zmq: tuple[Cluster, object], in_process: tuple[Cluster, object]) -> None:
    (zc, zr), (pc, pr) = over_zmq, in_process
    assert list(zr.records) == list(pr.records)  # every routing decision, hence every record
    assert zr.summary == pr.summary
    assert index_of(zc) == index_of(pc) and zc.router.index.page_bytes == pc.router.index.page_bytes
    assert zc.router.index.anomalies == 0
    for t, (_, sim) in enumerate(zc.targets):  # and the index is the trees', page for page
        assert zc.router.index.hashes_of(zc.router.worker(t)) == sim.radix.page_hashes()


def test_routing_over_zmq_equals_routing_in_process(chat, in_process):
    cluster, result = over_zmq = run_cluster(
        replace(BASE, kv_events_endpoint=LOOPBACK, kv_events_replay_endpoint=LOOPBACK), chat
    )
    assert result.summary["evicted_tokens"] > 0 and len({r.id for r in result.records}) == len(chat)
    subs = cluster.router.feed.subscribers
    assert len(subs) == 3 and all(s.next_seq > 0 for s in subs)  # every instance's events crossed its socket
    # every batch applied once: from PUB, or from a replay when its PUB copy was late (that copy then arrives
    # as a duplicate, which a loaded machine makes happen: catch_up replays a tail silent for 0.2 s)
    assert all(s.received - s.duplicates + s.replayed == s.next_seq and s.unrecovered == 0 for s in subs)
    assert_same_run(over_zmq, in_process)


def test_batches_dropped_on_the_wire_are_replayed_and_the_run_is_unchanged(chat, in_process):
    cfg = replace(BASE, kv_events_endpoint=LOOPBACK, kv_events_replay_endpoint=LOOPBACK)
    cluster, _ = over_zmq = run_cluster(cfg, chat, drop_on_pub=lambda seq: seq % 4 == 1)
    subs = cluster.router.feed.subscribers
    assert sum(s.replayed for s in subs) >= sum(s.next_seq // 4 for s in subs) > 0  # every dropped one came back
    assert sum(s.gaps for s in subs) > 0 and all(s.unrecovered == 0 for s in subs)
    assert_same_run(over_zmq, in_process)


def test_without_replay_the_publishers_wait_for_their_subscribers_and_lose_nothing(chat, in_process):
    cluster, _ = over_zmq = run_cluster(replace(BASE, kv_events_endpoint=LOOPBACK), chat)
    assert all(s.unrecovered == 0 and s.replayed == 0 for s in cluster.router.feed.subscribers)
    assert_same_run(over_zmq, in_process)


def test_a_batch_lost_without_replay_stops_the_run_with_one_error(chat):
    cluster = Cluster(replace(BASE, kv_events_endpoint=LOOPBACK), build_setup(BASE), chat)
    try:
        cluster.router.feed.timeout_s = 1.0
        for pub in cluster.router.feed.publishers:
            pub.drop_on_pub = lambda seq: seq == 0
        with pytest.raises(DsakvError, match="KV events of "):  # lost for good, or never arrived: either way
            cluster.run()
    finally:
        cluster.close()


def test_a_hole_without_replay_is_a_loss_for_good():
    with ZmqEventFeed(PrefixIndex(), 1, LOOPBACK) as feed:
        feed.publishers[0].drop_on_pub = lambda seq: seq == 0
        now = [0.0]
        feed.clock = lambda: now[0]
        feed.sink(0)(AllCleared())
        now[0] = 1.0
        feed.sink(0)(AllCleared())  # a second batch (another time): its arrival reveals the hole
        with pytest.raises(
            DsakvError, match="KV events of instance 0: 1 batches lost for good.*kv_events_replay_endpoint"
        ):
            feed.sync()


def test_a_drain_that_cannot_finish_raises_instead_of_hanging():
    with ZmqEventFeed(PrefixIndex(), 1, LOOPBACK, timeout_s=0.3) as feed:
        feed.publishers[0].drop_on_pub = lambda seq: True  # nothing arrives, and there is no replay socket
        feed.sink(0)(AllCleared())
        with pytest.raises(DsakvError, match=r"KV events of 0: 0 of 1 batches applied within 0.3 s"):
            feed.sync()


def test_the_one_instance_run_goes_through_the_cluster_when_it_publishes(chat):
    cfg = SimConfig(router="kv-aware", pool_tokens=12_800, step_model="constant")
    in_process = simulate(cfg, chat)
    over_zmq = simulate(replace(cfg, kv_events_endpoint=LOOPBACK, kv_events_replay_endpoint=LOOPBACK), chat)
    assert list(over_zmq.records) == list(in_process.records)
    assert {k: v for k, v in over_zmq.summary.items() if k in in_process.summary} == in_process.summary


def test_instances_publish_at_the_port_plus_their_index():
    assert [instance_endpoint("tcp://127.0.0.1:5557", i) for i in range(3)] == [
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
        "tcp://127.0.0.1:5559",
    ]
    assert instance_endpoint("tcp://*:*", 4) == "tcp://*:*"
    assert instance_endpoint("ipc:///tmp/kv", 2) == "ipc:///tmp/kv-2"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"router": "oracle", "kv_events_endpoint": "tcp://127.0.0.1:5557"}, "feeds the kv-aware router's index"),
        ({"kv_events_replay_endpoint": "tcp://127.0.0.1:5558"}, "kv_events_replay_endpoint: needs kv_events_endpoint"),
        ({"kv_events_endpoint": "localhost:5557"}, "kv_events_endpoint = 'localhost:5557': must be a ZMQ endpoint"),
        ({"kv_events_endpoint": "tcp://127.0.0.1"}, "must end in :PORT"),
        ({"kv_events_endpoint": "tcp://127.0.0.1:65534"}, "ports 65534 to 65536, past 65535"),
        (
            {"kv_events_endpoint": "tcp://127.0.0.1:5557", "kv_events_replay_endpoint": "tcp://127.0.0.1:5559"},
            "instance 0 would bind tcp://127.0.0.1:5559, which kv_events_endpoint of instance 2 binds",
        ),
    ],
)
def test_bad_kv_events_config_is_one_error_naming_the_field(kwargs, needle):
    with pytest.raises(DsakvError, match=needle):
        SimConfig(**{"instances": 3, "router": "kv-aware", **kwargs})


def test_a_sweep_cannot_publish_from_one_address(chat):
    from dsakv.sim.source import Source
    from dsakv.sim.sweep import run_sweep

    base = replace(BASE, kv_events_endpoint="tcp://127.0.0.1:5557")
    with pytest.raises(DsakvError, match="kv_events_endpoint: a sweep runs its points at once"):
        run_sweep(base, [{"instances": 2}, {"instances": 3}], Source(scenario="chat", scale=0.05), workers=1)
