"""The planner's DCP and kpool figures proven: for every (dcp, index_kpool, layout) the planner's bytes per
token, pool tokens and pages are what the real pool allocates for the same budget; ``dsakv plan --dcp 8`` and
``--kpool 2 --page-size 128`` report the pool the engine's pool builds."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main
from dsakv.engine.config import EngineConfig
from dsakv.engine.pool_dcp import DcpPool, pool_for_pages
from dsakv.errors import DsakvError
from dsakv.planner.budget import RankCell, index_buf_pages, index_buf_size, pool_capacity
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

TINY = ModelSpec.preset("tiny")


def rank_bytes(pool) -> int:
    return pool.rank_nbytes if isinstance(pool, DcpPool) else pool.nbytes


@pytest.mark.parametrize("kind", ["slot", "packed"])
@pytest.mark.parametrize("kpool", [1, 2, 4])
@pytest.mark.parametrize(
    "dcp, replicated", [(1, False), (2, False), (4, False), (8, False), (2, True), (4, True), (8, True)]
)
@pytest.mark.parametrize("mtp_layers", [0, 1])
def test_planner_pool_is_what_the_pool_allocates(dcp, replicated, kpool, kind, mtp_layers):
    layout = CacheLayout(TINY, page_size=64 * kpool, index_kpool=kpool, mtp_layers=mtp_layers)
    cell = RankCell(layout, dcp, replicated)
    budget = 3 * cell.page_bytes + cell.page_bytes // 2  # three whole pages and a remainder
    cap = pool_capacity(layout, available_bytes=budget, dcp=dcp, dcp_replicated=replicated)
    pool = pool_for_pages(layout, cap.num_pages, dcp=dcp, kind=kind, dcp_replicated=replicated)
    pool.check_integrity()
    P = pool.num_physical_pages
    assert (P, pool.allocator.num_pages, pool.allocator.first_page) == (
        cap.physical_pages,
        cap.num_pages,
        cap.scratch_pages,
    )
    assert rank_bytes(pool) == cap.pool_bytes == P * cap.page_bytes  # one rank's share, byte for byte
    assert pool.layout.page_size == cap.group_page_tokens and cap.pool_tokens == cap.num_pages * pool.layout.page_size
    assert cell.cell_bytes == rank_bytes(pool) / (P * pool.layout.page_size)  # bytes a token costs a rank
    main = sum(pool.rank_main_view(0, la).numel() if dcp > 1 else pool.main_view(la).numel()
               for la in range(layout.num_attention_layers))  # fmt: skip
    assert main == P * cell.main_page_bytes and rank_bytes(pool) - main == P * cell.indexer_page_bytes
    if dcp > 1 and not replicated:  # SGLang's index_buf_size for the replicated indexer K (one padding page)
        size = (P - 1) * layout.page_size
        assert pool.rank_indexer_view(0, 0).shape[0] == index_buf_pages(size, layout.page_size, dcp) == P * dcp
    if replicated:  # the whole pool on every rank: size counts the group's tokens, index_buf_size = size
        V = layout.page_size * dcp
        size = (P - 1) * V
        assert index_buf_size(size, V, dcp, dcp_replicated=True) == size
        assert pool.rank_indexer_view(0, 0).shape[0] == index_buf_pages(size, V, dcp, dcp_replicated=True) * dcp
        assert main == P * V * layout.main_row_bytes * layout.num_attention_layers  # no layer sharded
        assert cell.main_bytes(V) == V * layout.main_row_bytes * layout.num_attention_layers


def test_dcp_replicated_needs_a_dcp_group():
    with pytest.raises(DsakvError, match=r"dcp_replicated = True: only meaningful with dcp > 1"):
        pool_for_pages(CacheLayout(TINY), 4, dcp=1, dcp_replicated=True)
    with pytest.raises(DsakvError, match=r"dcp_replicated = True: only meaningful with dcp > 1"):
        EngineConfig(dcp_replicated=True)
    with pytest.raises(DsakvError, match=r"dcp_replicated = 1: must be True or False"):
        EngineConfig(dcp=2, dcp_replicated=1)


def test_index_buf_size_is_sglangs_rule():
    assert index_buf_size(4096, 64, 4) == (4096 + 64) * 4 - 64 == 16_576
    assert index_buf_size(4096, 64, 4, dcp_replicated=True) == 4096
    assert index_buf_pages(4096, 64, 4) == (4096 // 64 + 1) * 4 == index_buf_pages(4096, 64, 1) * 4
    assert index_buf_pages(4096 * 4, 64 * 4, 4, dcp_replicated=True) == 4096 // 64 + 1  # the draft's own pages


def plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv, dcp, kpool", [(["--dcp", "8"], 8, 1), (["--kpool", "2", "--page-size", "128"], 1, 2)], ids=["dcp8", "kpool2"]
)
def test_cli_plan_reports_the_pool_the_engine_allocates(capsys, argv, dcp, kpool):
    got = plan_json(capsys, *argv)
    layout = CacheLayout(ModelSpec.preset("glm-5.3"), page_size=64 * kpool, index_kpool=kpool)
    assert got["pool"]["page_bytes"] == RankCell(layout, dcp).page_bytes  # the H200 figure: too big to allocate
    small = plan_json(capsys, *argv, "--available-bytes", "20MB")["pool"]  # the same setting on a small budget
    pool = pool_for_pages(layout, small["num_pages"], dcp=dcp)
    assert rank_bytes(pool) == small["pool_bytes"] and pool.num_physical_pages == small["physical_pages"]
    assert small["pool_tokens"] == pool.allocator.num_pages * pool.layout.page_size
    assert small["page_bytes"] == got["pool"]["page_bytes"]


def test_cli_plan_refuses_a_32_token_indexer_page(capsys):
    assert main(["plan", "--kpool", "2", "--page-size", "64"]) == 1
    err = capsys.readouterr().err
    assert "physical page is page_size // index_kpool = 32 tokens" in err and len(err.strip().splitlines()) == 1
