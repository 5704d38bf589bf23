"""``dsakv demo --dcp 2 --json``: the DCP group's run against the one-rank reference, tokens and caches."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_demo_dcp_2_reports_outputs_and_caches_matching_one_rank(capsys):
    argv = ["demo", "--dcp", "2", "--conversations", "3", "--pages", "5", "--max-new-tokens", "4", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["dcp"] == 2 and d["outputs_match"] is True and d["caches_match"] is True
    assert d["hit_tokens"] > 0 and d["evicted_tokens"] > 0
