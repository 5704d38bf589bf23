"""The lower-tier flags of ``dsakv plan`` and ``dsakv simulate``: exact figures for good values, one line and
exit status 1 for bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsakv.cli import main
from tests.cli.cli_checks import assert_one_line_error

PAGE_BYTES = 3_452_160  # GLM-5.3: 53,940 B/token x 64 tokens, both caches


def plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_host_and_store_tokens_are_whole_pages_of_both_caches(capsys):
    d = plan_json(capsys, "--host-bytes", "2TB", "--store-bytes", "20TB")
    assert d["host_tokens"] == 2 * 10**12 // PAGE_BYTES * 64 == 37_078_208
    assert d["store_tokens"] == 20 * 10**12 // PAGE_BYTES * 64 == 370_782_336
    t = d["tiers"]
    # one host pool per rank: eight copies on the node, each an eighth of the memory
    assert t["host_tokens_per_rank_pools"] == 2 * 10**12 // 8 // PAGE_BYTES * 64 == 4_634_752
    assert (t["gpus_per_node"], t["groups_per_node"], t["entry_bytes"]) == (8, 1, PAGE_BYTES)


def test_plan_units_and_dp_attention(capsys):
    binary = plan_json(capsys, "--host-bytes", "1.5TiB")
    assert binary["host_tokens"] == int(1.5 * 2**40) // PAGE_BYTES * 64
    assert binary["store_tokens"] is None
    dp = plan_json(capsys, "--host-bytes", "2TB", "--dp-attention", "8")
    assert dp["tiers"]["groups_per_node"] == 8  # eight groups with their own pages share the node's memory
    assert dp["host_tokens"] == 2 * 10**12 // 8 // PAGE_BYTES * 64
    assert "host_tokens" not in plan_json(capsys)  # no tier flag: no tier figures


def test_plan_prints_the_tier_table(capsys):
    assert main(["plan", "--host-bytes", "500GB"]) == 0
    out = capsys.readouterr().out
    assert "Lower tiers" in out and f"{500 * 10**9 // PAGE_BYTES * 64:,}" in out and "8 copies per node" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--host-bytes", "2XB"], "--host-bytes = '2XB': must be a byte count"),
        (["plan", "--store-bytes=-5GB"], "--store-bytes = '-5GB': must be"),
        (["plan", "--host-bytes", "unbounded"], "--host-bytes = 'unbounded': must be a byte count"),
        (["simulate", "--host-bytes", "lots"], "--host-bytes = 'lots': must be a byte count (e.g. 2TB"),
        (["simulate", "--store-bytes", "1e30"], "--store-bytes = '1e30': must be a byte count"),
        (["simulate", "--host-tokens", "-1"], "--host-tokens = '-1': must be an integer >= 0"),
        (["simulate", "--host-bytes", "1TB", "--host-tokens", "64"], "give the host tier's size one way"),
        (["simulate", "--store-gbps", "0"], "--store-gbps = '0': must be a positive number"),
        (["simulate", "--store-gbps", "fast"], "--store-gbps = 'fast': must be a positive number"),
        (["simulate", "--write-policy", "later"], "write_policy = 'later': must be one of write_through"),
        (["simulate", "--hit-threshold", "0"], "--hit-threshold = '0': must be an integer >= 1"),
        (["simulate", "--host-tokens", "64", "--no-prefix-cache"], "tiers need the prefix cache"),
    ],
)
def test_bad_tier_flags_are_one_line(capsys, argv, needle):
    code = main([*argv, "--scenario", "chat", "--scale", "0.05"] if argv[0] == "simulate" else argv)
    assert_one_line_error(code, capsys.readouterr().err, needle)


@pytest.mark.parametrize(
    "argv",
    [
        ["--host-bytes", "unbounded"],
        ["--host-tokens", "100000", "--store-bytes", "1.5TiB", "--write-policy", "write_back"],
        ["--store-tokens", "50000", "--store-gbps", "50"],
        ["--host-bytes", "500GB", "--write-policy", "write_through_selective", "--hit-threshold", "1"],
    ],
)
def test_simulate_tier_flags_report_hits_per_tier(capsys, argv):
    base = ["simulate", "--json", "--scenario", "chat", "--scale", "0.1", "--pool-tokens", "20000"]
    assert main([*base, *argv]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["hit_tokens"] == s["hit_tokens_device"] + s["hit_tokens_host"] + s["hit_tokens_store"]
    assert s["hit_tokens_host"] + s["hit_tokens_store"] > 0
    for tier in ("host", "store"):
        for way in ("read", "written"):
            split = s["tier_bytes"][tier][way]
            assert s[f"{tier}_bytes_{way}"] == split["main"] + split["indexer"]
            assert split["main"] * 2_772 == split["indexer"] * 51_168  # both caches move together, page by page


def test_simulate_table_shows_the_tiers(capsys):
    argv = ["simulate", "--scenario", "chat", "--scale", "0.1", "--pool-tokens", "20000", "--host-bytes", "1TB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "loaded from host" in out and "host read (GB)" in out and "store written (GB)" in out


def test_the_capacity_table_in_the_docs_is_the_planners(capsys):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tiers.md").read_text()
    for size in ("500GB", "1TB", "2TB", "4TB"):
        d = plan_json(capsys, "--host-bytes", size)
        row = f"| `--host-bytes {size}` | {d['host_tokens']:,} | {d['tiers']['host_tokens_per_rank_pools']:,} |"
        assert row in doc
    assert f"| {plan_json(capsys, '--store-bytes', '20TB')['store_tokens']:,} |" in doc
