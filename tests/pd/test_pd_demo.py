"""``dsakv demo --pd --json``: a decode process matches one engine, over the transfer engine and the store."""

from __future__ import annotations

import json

from dsakv.cli import main

SMALL = ["demo", "--pd", "--json", "--conversations", "2", "--max-new-tokens", "3"]


def test_demo_pd_outputs_and_caches_match(capsys, transfer_engine_installed):
    """Over the transfer engine (the store route's engine test is ``test_store_route_matches_one_engine``)."""
    transport = "mooncake"
    assert main(SMALL) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match"] and out["caches_match"] and out["integrity_ok"]
    assert out["outcomes"] == "success" and out["pd_transport"] == transport
    assert out["pd_skipped_pages"] == 5  # the second hand-off skips the shared 80-token system prompt
    assert out["pd_pages"] > 0 and out["pd_bytes_main"] > out["pd_bytes_indexer"] > 0


def test_demo_pd_store_without_a_store_is_one_line(capsys):
    assert main([*SMALL, "--pd-transport", "store"]) == 1
    assert "needs --store" in capsys.readouterr().err
