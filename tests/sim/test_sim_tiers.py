"""The simulator with lower tiers: hit tokens per tier add up, and with an unbounded store and requests that
never overlap every page a request could reuse is found in some tier: the hit equals an independent walk
over the trace's page identities (no dsakv hashing involved)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.scheduler import BatchPlan
from dsakv.scheduler.tiers import LoadBack, WriteBack
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.transfers import TransferModel
from dsakv.workloads.traces import MOONCAKE_BLOCK, TraceRequest, read_mooncake

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
PAGE = 64  # the GLM-5.3 page size the simulator runs at
POOL_TOKENS = 40_000  # a small device pool: most reuse has to come back from the store


def walk_hit_tokens(requests: list[TraceRequest], page: int = PAGE) -> list[int]:
    """Per request, in order: tokens of the longest prefix of whole pages that an earlier request's prompt
    held, never the whole prompt (one token is always computed). A page is named by the hash ids of every
    512-token block up to the one it lies in, and its place in that block (blocks are ``h*512 ..``: a
    partial last block holds the first tokens of the full one), plus the request's namespace."""
    seen: set[tuple] = set()
    hits = []
    per_block = MOONCAKE_BLOCK // page
    for r in requests:
        names = [
            (r.tenant, r.cache_salt, tuple(r.hash_ids[: i // per_block + 1]), i % per_block)
            for i in range(r.input_length // page)
        ]
        limit = (r.input_length - 1) // page
        n = 0
        while n < limit and names[n] in seen:
            n += 1
        hits.append(n * page)
        seen.update(names)
    return hits


def generated_trace(seed: int, n: int) -> list[TraceRequest]:
    """Conversations that grow turn by turn, on a few shared system prompts, one request every 10 s."""
    rng = random.Random(seed)
    systems = [[1000 * s + j for j in range(rng.randint(1, 4))] for s in range(3)]
    convos: list[list[int]] = []
    out = []
    next_id = 10**6
    for k in range(n):
        if convos and rng.random() < 0.6:
            history = rng.choice(convos)
        else:
            history = list(rng.choice(systems))
            convos.append(history)
        for _ in range(rng.randint(1, 3)):
            history.append(next_id)
            next_id += 1
        length = (len(history) - 1) * MOONCAKE_BLOCK + rng.randint(1, MOONCAKE_BLOCK)
        out.append(TraceRequest(10_000.0 * k, length, rng.randint(1, 40), tuple(history), line=k + 1))
    return out


def _tiered(**kw) -> SimConfig:
    return SimConfig(pool_tokens=POOL_TOKENS, step_model="constant", time_scale=1000.0, **kw)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_unbounded_store_hits_equal_the_page_walk_on_a_generated_trace(policy):
    requests = generated_trace(seed=3, n=120)
    result = simulate(_tiered(store_bytes="unbounded", write_policy=policy), requests, check_every=25)
    s = result.summary
    assert s["finished"] == len(requests)
    by_line = {r.line: r.hit_tokens for r in result.records}
    assert [by_line[r.line] for r in requests] == walk_hit_tokens(requests)
    assert s["hit_tokens"] == s["hit_tokens_device"] + s["hit_tokens_host"] + s["hit_tokens_store"]
    assert s["hit_tokens_store"] > 0 and s["hit_tokens_host"] == 0
    setup = result.tiers.setup
    page_bytes = setup.entry_main_bytes + setup.entry_indexer_bytes
    assert s["store_bytes_read"] == s["hit_tokens_store"] // PAGE * page_bytes
    assert s["tier_bytes"]["store"]["read"]["indexer"] == s["hit_tokens_store"] // PAGE * setup.entry_indexer_bytes


def test_host_and_store_split_the_hit_and_the_walk_still_holds():
    requests = generated_trace(seed=5, n=120)
    result = simulate(_tiered(host_tokens=600 * PAGE, store_bytes="unbounded"), requests, check_every=25)
    s = result.summary
    by_line = {r.line: r.hit_tokens for r in result.records}
    assert [by_line[r.line] for r in requests] == walk_hit_tokens(requests)
    assert s["hit_tokens_host"] > 0 and s["hit_tokens_store"] > 0 and s["hit_tokens_device"] > 0
    assert s["hit_tokens"] == s["hit_tokens_device"] + s["hit_tokens_host"] + s["hit_tokens_store"]


def test_no_tier_reports_zero_and_a_tier_only_adds_hits():
    requests = generated_trace(seed=7, n=80)
    plain = simulate(_tiered(), requests).summary
    host = simulate(_tiered(host_bytes="unbounded"), requests).summary
    assert plain["hit_tokens_host"] == plain["hit_tokens_store"] == plain["store_bytes_written"] == 0
    assert plain["tier_bytes"] is None and plain["hit_tokens_device"] == plain["hit_tokens"]
    assert host["hit_tokens"] == sum(walk_hit_tokens(requests)) > plain["hit_tokens"]
    assert host["store_bytes_read"] == host["store_bytes_written"] == 0


def test_load_backs_delay_first_tokens_by_the_link_time():
    """A slow store link makes store hits wait: TTFT grows with the transfer time, hits do not change."""
    requests = generated_trace(seed=3, n=60)
    fast = simulate(_tiered(store_bytes="unbounded", store_gbps=1000.0), requests).summary
    slow = simulate(_tiered(store_bytes="unbounded", store_gbps=0.5), requests).summary
    assert fast["hit_tokens_store"] == slow["hit_tokens_store"] > 0
    assert slow["ttft_s"]["mean"] > fast["ttft_s"]["mean"]


def test_tier_setup_follows_the_planner():
    setup = build_setup(SimConfig(host_bytes=2 * 10**12, store_bytes=20 * 10**12)).tiers
    assert setup.host_pages == 2 * 10**12 // 3_452_160 == 579_347  # GLM-5.3: 53,940 B/token x 64
    assert setup.store_pages == 20 * 10**12 // 3_452_160
    assert (setup.host_link, setup.host_link_bytes_per_s) == ("PCIe Gen5 x16", 55e9)
    gb200 = build_setup(SimConfig(gpu=GpuSetting(gpu="GB200"), host_bytes=4 * 3_452_160 * 10)).tiers
    assert (gb200.host_link, gb200.host_link_bytes_per_s) == ("NVLink-C2C", 225e9)
    assert gb200.host_pages == 4 * 10  # TP8 spans two 4-GPU trays: each tray's host holds a whole copy
    dp = build_setup(SimConfig(gpu=GpuSetting(dp_attention=8), host_bytes=8 * 3_452_160 * 10)).tiers
    assert dp.host_pages == 10  # eight attention groups on the node share its host memory


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"host_bytes": -1}, "host_bytes = -1: must be an integer >= 0 or 'unbounded'"),
        ({"store_bytes": "lots"}, "store_bytes = 'lots': must be an integer >= 0 or 'unbounded'"),
        ({"host_bytes": 1, "host_tokens": 1}, "host_bytes and host_tokens: give the host tier's size one way"),
        ({"store_gbps": 0}, "store_gbps = 0: must be a positive number of GB/s"),
        ({"write_policy": "lazy"}, "write_policy = 'lazy': must be one of"),
        ({"host_tokens": 64, "prefix_cache": False}, "host/store tiers need the prefix cache"),
    ],
)
def test_bad_tier_config_is_one_error(kw, message):
    with pytest.raises(DsakvError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        SimConfig(**kw)


@pytest.mark.skipif(not TRACE.exists(), reason=f"{TRACE} is absent; the generated-trace tests cover the walk")
def test_unbounded_store_hits_equal_the_page_walk_on_the_conversation_trace():
    """The Mooncake conversation trace stamps about ten requests with each timestamp: to keep requests from
    overlapping they run one at a time (closed loop of 1), with one output token each (the walk reads prompts
    only; output pages never match a later prompt). The whole trace: 12,031 requests, 54,093,952 hit tokens."""
    requests = [replace(r, output_length=1) for r in read_mooncake(TRACE)]
    cfg = replace(_tiered(store_bytes="unbounded"), max_concurrency=1, pool_tokens=None)
    result = simulate(cfg, requests)
    by_line = {r.line: (r.hit_tokens, r.outcome) for r in result.records}
    assert all(by_line[r.line][1] == "finished" for r in requests)
    walk = walk_hit_tokens(requests)
    assert [by_line[r.line][0] for r in requests] == walk and sum(walk) > 0


def test_transfer_model_prices_each_queue_in_plan_order():
    """Host load: pages x rank page / link; store load: the network leg, then the link; eviction write-backs
    (write_back) stall the step until the d2h queue has read them."""
    setup = build_setup(SimConfig(host_bytes=10**12, store_bytes=10**13, write_policy="write_back")).tiers
    link, net, page = setup.host_link_bytes_per_s, setup.store_bytes_per_s, setup.rank_page_bytes
    model = TransferModel(setup)
    plan = BatchPlan(step=0)
    plan.write_backs.append(WriteBack("host", [b"w"] * 3, [1, 2, 3], [0, 1, 2]))
    plan.load_backs.append(LoadBack("r", "host", [b"a"] * 4, [4, 5, 6, 7], [3, 4, 5, 6]))
    plan.load_backs.append(LoadBack("r", "store", [b"b"] * 2, [8, 9], []))
    stall, done = model.carry_out(plan, 10.0)
    assert stall == pytest.approx(3 * page / link)
    host_end = 10.0 + 4 * page / link
    store_net_end = 10.0 + 2 * page / net
    assert done == [(pytest.approx(max(host_end, store_net_end) + 2 * page / link), "r")]
    c = model.counters
    assert (c.host_pages_written, c.host_pages_read, c.store_pages_read, c.load_backs) == (3, 4, 2, 2)
