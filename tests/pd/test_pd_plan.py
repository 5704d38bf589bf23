"""``dsakv plan --pd``: the bytes a hand-off moves per cache (DESIGN.md's GLM-5.3 table) and the link seconds."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main
from dsakv.planner.pd import IB_NDR_BYTES_PER_S, pd_plan, pd_row
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def test_glm53_handoff_bytes_equal_the_context_table():
    rows = {r.context: r for r in pd_plan(CacheLayout(ModelSpec.preset("glm-5.3")), "H200").rows}
    assert (rows[1_048_576].pd_bytes_main, rows[1_048_576].pd_bytes_indexer) == (53_653_536_768, 2_906_652_672)
    assert rows[8_192].pd_bytes_total == 441_876_480 and rows[8_192].pages == 128
    assert rows[1_048_576].transfer_s["ib_400g"] == 56_560_189_440 / IB_NDR_BYTES_PER_S


def test_mtp_layer_moves_its_main_and_index_k_too():
    lay = CacheLayout(ModelSpec.preset("glm-5.3"), mtp_layers=1)
    r = pd_row(lay, 64, {"x": 1.0})
    assert r.pd_bytes_mtp == 64 * (656 + 132)
    assert r.pd_bytes_total == 64 * 54_728  # DESIGN.md: GLM-5.3 with one MTP layer


def test_cli_plan_pd_json_has_the_rows_and_the_custom_link(capsys):
    assert main(["plan", "--pd", "--link-gbps", "800", "--context", "200000", "--json"]) == 0
    pd = json.loads(capsys.readouterr().out)["pd"]
    row = next(r for r in pd["rows"] if r["context"] == 200_000)
    assert row["pd_bytes_total"] == row["pd_bytes_main"] + row["pd_bytes_indexer"]
    assert row["transfer_s"]["link"] == pytest.approx(row["pd_bytes_total"] / 100e9)
    assert row["skip_indexer_recompute_tokens"] == 200_000


def test_cli_link_gbps_without_pd_or_not_positive_is_one_line(capsys):
    assert main(["plan", "--link-gbps", "100"]) == 1
    assert main(["plan", "--pd", "--link-gbps", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "needs --pd" in err[0] and "positive" in err[1]
