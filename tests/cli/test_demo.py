"""``dsakv demo``: the shared-prefix chat under memory pressure matches the unpressured reference."""

from __future__ import annotations

import json

import pytest
import torch

from dsakv.cli import main


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_demo_json_reports_pressure_and_matching_outputs(capsys):
    assert main(["demo", "--json", "--conversations", "4", "--max-new-tokens", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "outputs_match",
        "hit_tokens",
        "evicted_tokens",
        "preemptions",
        "offloaded_bytes_main",
        "offloaded_bytes_indexer",
    ):
        assert key in out
    assert out["outputs_match"] is True and out["caches_match"] is True
    assert out["hit_tokens"] > 0 and out["evicted_tokens"] > 0 and out["preemptions"] > 0
    assert out["offloaded_bytes_main"] == out["offloaded_pages"] * out["main_page_bytes"] > 0
    assert out["offloaded_bytes_indexer"] == out["offloaded_pages"] * out["indexer_page_bytes"] > 0
    assert out["pages_saved"] == out["pages_written_reference"] - out["pages_written"] > 0


def test_demo_table_prints(capsys):
    assert main(["demo", "--conversations", "2", "--turns", "1", "--max-new-tokens", "2"]) == 0
    assert "outputs match" in capsys.readouterr().out


def test_demo_pool_too_small_is_one_line_error(capsys):
    assert main(["demo", "--pages", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dsakv: error: --pages = 2") and err.count("\n") == 1


def test_demo_unknown_preemption_mode_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse exits while parsing; the CLI makes it status 1
        main(["demo", "--preemption", "swap"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "swap" in err and "offload" in err and "recompute" in err and err.count("\n") == 1
