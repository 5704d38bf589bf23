"""``dsakv demo --num-speculative-tokens K``: MTP speculative decoding under memory pressure matches the reference run (which
runs the MTP layer without drafting), and reports its drafts."""

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


def test_demo_mtp_json_matches_the_reference_and_reports_drafts(capsys):
    argv = ["demo", "--json", "--conversations", "2", "--max-new-tokens", "6", "--num-speculative-tokens", "3"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match"] is True and out["caches_match"] is True
    assert out["mtp_steps"] == 3 and out["draft_tokens"] > 0
    assert 0 <= out["accepted_tokens"] <= out["draft_tokens"]
    assert out["acceptance_rate"] == round(out["accepted_tokens"] / out["draft_tokens"], 4)


@pytest.mark.parametrize("value", ["-1", "1000000"])
def test_demo_bad_mtp_is_a_one_line_error(value, capsys):
    assert main(["demo", "--conversations", "1", "--num-speculative-tokens", value]) == 1
    err = capsys.readouterr().err.strip()
    assert "num-speculative-tokens" in err or "num_speculative_tokens" in err
    assert "\n" not in err
