"""``dsakv simulate --pd xPyD``: the hand-off's bytes are the moved pages times the layout's per-page bytes by
cache, a decode-side prefix hit moves fewer pages, TTFT carries the hand-off, every request finishes with both
sides consistent, and bad ``--pd`` values are one-line errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.cli import main
from dsakv.errors import DsakvError
from dsakv.planner.pd import IB_NDR_BYTES_PER_S
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.pd import PdConfig, parse_pd, run_pd
from dsakv.spec.layout import ceil_div
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import TraceRequest


@pytest.fixture(scope="module")
def setup():
    return build_setup(SimConfig())


def _request(at_ms: float, tokens: int, output: int, first_block: int = 0) -> TraceRequest:
    return TraceRequest(at_ms, tokens, output, tuple(range(first_block, first_block + ceil_div(tokens, 512))))


def _page_bytes(setup) -> tuple[int, int]:
    lay = setup.layout  # every attention layer's main KV; every full layer's index-K (the spec's schedule)
    main = lay.main_page_bytes_per_layer * lay.num_attention_layers
    return main, lay.indexer_page_bytes_per_layer * lay.num_indexer_layers


def test_the_layout_bytes_are_its_layers_bytes(setup):
    lay = setup.layout
    assert (lay.main_page_bytes, lay.indexer_page_bytes) == _page_bytes(setup)


@settings(max_examples=8, deadline=None)
@given(tokens=st.integers(1, 20_000))
def test_bytes_moved_are_the_prompt_pages_times_each_caches_page_bytes(setup, tokens):
    result = run_pd(SimConfig(), PdConfig(1, 1), [_request(0.0, tokens, 3)], setup=setup)
    pages = ceil_div(tokens, setup.layout.page_size)
    main, index = _page_bytes(setup)
    s = result.summary
    assert s["pd_transfer_pages"] == pages
    assert s["pd_transfer_bytes_main"] == pages * main
    assert s["pd_transfer_bytes_indexer"] == pages * index
    assert s["pd_transfer_s"] == pytest.approx(pages * (main + index) / IB_NDR_BYTES_PER_S)


def test_a_decode_side_hit_skips_those_pages(setup):
    # the same 8,000-token conversation prefix twice, 10 s apart: the second request's pages are on both sides
    reqs = [_request(0.0, 8_000, 4), _request(10_000.0, 8_000, 4)]
    cached = run_pd(SimConfig(), PdConfig(1, 1), reqs, setup=setup).summary
    cold_cfg = SimConfig(prefix_cache=False)
    cold = run_pd(cold_cfg, PdConfig(1, 1), reqs, setup=build_setup(cold_cfg)).summary
    full = ceil_div(8_000, setup.layout.page_size)
    assert cold["pd_transfer_pages"] == 2 * full and cold["pd_decode_hit_tokens"] == 0
    assert cached["pd_decode_hit_tokens"] > 0
    hit_pages = cached["pd_decode_hit_tokens"] // setup.layout.page_size
    assert cached["pd_transfer_pages"] == 2 * full - hit_pages
    assert cached["pd_transfer_bytes_main"] < cold["pd_transfer_bytes_main"]
    assert cached["pd_transfer_bytes_indexer"] < cold["pd_transfer_bytes_indexer"]


def test_ttft_carries_the_prefill_and_the_hand_off(setup):
    req = _request(0.0, 12_000, 6)
    alone = simulate(SimConfig(), [req], setup=setup).records[0]
    pd = run_pd(SimConfig(), PdConfig(1, 1), [req], setup=setup)
    rec = pd.records[0]
    main, index = _page_bytes(setup)
    transfer_s = ceil_div(12_000, setup.layout.page_size) * (main + index) / IB_NDR_BYTES_PER_S
    assert rec.outcome == "finished" and rec.output_tokens == 6
    assert rec.ttft_s >= alone.ttft_s + transfer_s - 1e-12
    assert pd.summary["pd_prefill_ttft_s"] == pytest.approx(alone.ttft_s)  # the prefill side alone is the same
    assert rec.ttft_s == pytest.approx(alone.ttft_s + transfer_s)  # nothing else on the decode side


@pytest.mark.parametrize("shape,router", [((1, 1), "round-robin"), ((2, 2), "kv-aware"), ((1, 3), "least-loaded")])
def test_every_request_finishes_and_both_sides_stay_consistent(shape, router):
    reqs = generate_scenario("chat", seed=1, scale=0.05)
    cfg = SimConfig(router=router, pool_tokens=60_000)  # a small pool: evictions on both sides
    result = run_pd(cfg, PdConfig(*shape), reqs, check_every=7)  # check_integrity on both sides
    s = result.summary
    assert s["requests"] == len(reqs) == s["finished"]
    assert sorted(r.id for r in result.records) == list(range(len(reqs)))
    assert s["output_tokens"] == sum(r.output_length for r in reqs)
    assert s["instances"] == sum(shape)
    assert s["pd_transfer_pages"] > 0 and s["pd_transfer_s"] > 0


@pytest.mark.parametrize("text", ["0P1D", "1P", "1P0D", "PD", "2D1P", "x"])
def test_bad_pd_values_are_one_line_errors(text):
    with pytest.raises(DsakvError, match="--pd"):
        parse_pd(text, "H200")


@pytest.mark.parametrize(
    "argv",
    [["--pd", "0P1D"], ["--pd", "1P"], ["--pd", "1P1D", "--instances", "2"], ["--link-gbps", "100"]],
)
def test_the_cli_refuses_bad_pd_flags_in_one_line(argv, capsys):
    assert main(["simulate", "--scenario", "chat", "--scale", "0.01", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsakv: error: ") and "\n" not in err


def test_the_cli_json_has_the_hand_off_figures(capsys):
    argv = ["simulate", "--scenario", "chat", "--scale", "0.02", "--pd", "1P1D", "--link-gbps", "800", "--json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["pd_link_bytes_per_s"] == 800e9 / 8
    for key in ("pd_transfer_bytes_main", "pd_transfer_bytes_indexer", "pd_transfer_s", "ttft_s", "tpot_s"):
        assert key in s
    assert s["config"]["config"]["pd"]["prefill"] == 1


def test_the_mtp_layer_travels_with_the_hand_off():
    cfg = SimConfig(num_speculative_tokens=1)
    setup = build_setup(cfg)
    plain = build_setup(SimConfig()).layout
    lay = setup.layout
    assert lay.num_attention_layers == plain.num_attention_layers + lay.mtp_layers  # the draft layer's own cache
    s = run_pd(cfg, PdConfig(1, 1), [_request(0.0, 3_000, 5)], setup=setup).summary
    pages = ceil_div(3_000, lay.page_size)
    assert s["pd_transfer_bytes_main"] == pages * lay.main_page_bytes_per_layer * lay.num_attention_layers
    assert s["pd_transfer_bytes_indexer"] == pages * lay.indexer_page_bytes_per_layer * lay.num_indexer_layers
    assert s["pd_transfer_bytes_indexer"] > pages * plain.indexer_page_bytes  # the MTP layer's index-K too


def test_two_tenants_share_no_decode_side_page(setup):
    a = TraceRequest(0.0, 8_000, 4, tuple(range(16)), tenant="a")
    b = TraceRequest(10_000.0, 8_000, 4, tuple(range(16)), tenant="b")
    s = run_pd(SimConfig(), PdConfig(1, 1), [a, b], setup=setup).summary
    assert s["pd_decode_hit_tokens"] == 0
    assert s["pd_transfer_pages"] == 2 * ceil_div(8_000, setup.layout.page_size)
