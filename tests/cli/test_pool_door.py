"""One door for the pool: ``dsakv plan``, ``dsakv simulate``, the what-if table and ``--explain-tokens`` all
take it from ``dsakv.planner.budget.pool_capacity``, so the same flags give the same pool everywhere."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import build_parser, main
from dsakv.cli.plan import build_plan
from dsakv.cli.simulate import build_config
from dsakv.errors import DsakvError
from dsakv.planner.budget import pool_capacity
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.diagnose import explain_tokens
from dsakv.planner.plan import plan
from dsakv.sim.config import build_setup
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec

GLM = load_spec("glm-5.3")
PATTERN_39 = GLM.with_full_indexer_count(39).indexer_pattern

# (shape, dsakv plan flags, dsakv simulate flags): the flags differ only where the two commands name one knob
# differently (plan counts MTP cache layers, simulate draft tokens; one MTP layer either way).
SHAPES = [
    ("glm-5.3 H200 TP8", [], []),
    ("one MTP layer", ["--mtp-layers", "1"], ["--mtp", "1"]),
    ("DCP 2", ["--dcp", "2"], ["--dcp", "2"]),
    ("kpool 2, page 128", ["--kpool", "2", "--page-size", "128"], ["--kpool", "2", "--page-size", "128"]),
    ("DeepSeek-V3.2", ["--model", "deepseek-v3.2"], ["--model", "deepseek-v3.2"]),
    ("available bytes", ["--available-bytes", "80GB"], ["--available-bytes", "80GB"]),
    ("bytes, DCP 2, MTP", *[["--available-bytes", "60GB", "--dcp", "2", f, "1"] for f in ("--mtp-layers", "--mtp")]),
    ("indexer on all layers", ["--indexer-all-layers"], ["--indexer", "all"]),
    ("39 full indexer layers", ["--indexer-pattern", PATTERN_39], ["--indexer", "39"]),
    ("bf16, MI300X, DP attention 2", *[["--kv-dtype", "bf16", "--gpu", "MI300X", "--dp-attention", "2"]] * 2),
]


def _pools(plan_flags: list[str], sim_flags: list[str]):
    parser = build_parser()
    planned = build_plan(parser.parse_args(["plan", *plan_flags])).pool
    cfg, _ = build_config(parser.parse_args(["simulate", *sim_flags]))
    return planned, build_setup(cfg).capacity


@pytest.mark.parametrize("plan_flags, sim_flags", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_plan_and_simulate_take_the_same_pool_for_the_same_flags(plan_flags, sim_flags):
    planned, simulated = _pools(plan_flags, sim_flags)
    assert planned.to_dict() == simulated.to_dict() and planned.num_pages >= 1


def test_the_printed_pools_agree(capsys):
    """End to end: the JSON both commands print (a small scenario keeps the simulation short)."""
    flags = ["--dcp", "2", "--kpool", "2", "--page-size", "128"]
    assert main(["plan", "--json", *flags]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--json", "--scenario", "chat", "--scale", "0.02", *flags]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert (planned["pool_pages"], planned["pool_tokens"]) == (simulated["pool_pages"], simulated["pool_tokens"])
    assert simulated["config"]["setup"]["pool"]["memory"] == planned["pool"]["memory"]


def test_the_weights_priced_are_the_layouts_own():
    """An MTP layer or more full indexers add their weights; named weights_bytes replace the computed ones."""
    setting = GpuSetting()
    for layout in (CacheLayout(GLM, mtp_layers=1), CacheLayout(GLM.with_all_indexers_full())):
        mem, base = pool_capacity(layout, setting).memory, pool_capacity(CacheLayout(GLM), setting).memory
        assert mem.weights_computed and mem.weights_bytes > base.weights_bytes
    named = GpuSetting(weights_bytes=90 * 10**9)
    mem = pool_capacity(CacheLayout(GLM, mtp_layers=1), named).memory
    assert not mem.weights_computed and mem.weights_bytes == 90 * 10**9


@pytest.mark.parametrize(
    "label, plan_kwargs",
    [
        ("MTP layers = 1", {"layout": CacheLayout(GLM, mtp_layers=1)}),
        ("indexer on all 78 layers", {"layout": CacheLayout(GLM.with_all_indexers_full())}),
        ("39 full indexer layers", {"layout": CacheLayout(GLM.with_full_indexer_count(39))}),
        ("index_kpool = 2 (page 128)", {"layout": CacheLayout(GLM, index_kpool=2, page_size=128)}),
        ("DCP = 2", {"setting": GpuSetting(dcp=2)}),
        ("kv_dtype = bf16", {"layout": CacheLayout(GLM, kv_dtype="bf16")}),
    ],
)
def test_a_what_if_row_is_the_plan_of_that_layout(label, plan_kwargs):
    """The default plan's what-if row for a variant holds the pool ``dsakv plan`` prints for that variant."""
    rows = {r.label: r for r in plan(GLM).what_if}
    assert rows[label].pool_tokens == plan(GLM, **plan_kwargs).pool.pool_tokens


def test_explain_tokens_names_the_variant_whose_plan_gives_the_logged_pool():
    logged = plan(GLM, CacheLayout(GLM.with_full_indexer_count(39))).pool.pool_tokens
    explained = explain_tokens(logged, CacheLayout(GLM), setting=GpuSetting())
    assert explained.explained and explained.candidates[0].label == "39 full indexer layers"


def test_a_dcp_size_the_tp_layout_cannot_run_has_no_pool():
    setting = GpuSetting(dp_attention=2)  # attention TP 8 / 2 = 4
    rows = {r.label: r for r in plan(GLM, setting=setting).what_if}
    assert rows["DCP = 8"].pool_tokens is None and rows["DCP = 4"].pool_tokens > 0
    with pytest.raises(DsakvError, match="dcp = 8"):
        pool_capacity(CacheLayout(GLM), setting, dcp=8)
