"""``dsakv demo``: the shared-prefix chat under memory pressure matches the unpressured reference."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dsakv.cli import main
from dsakv.engine import POOL_KINDS
from dsakv.scheduler.policies import PREEMPTION_MODES


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


def printed_rows(out: str) -> dict[str, str]:
    """{figure: value} of every body row of the rich table (rows are ``│ figure │ value │``)."""
    rows = [line.strip("│").split("│") for line in out.splitlines() if line.startswith("│")]
    return {figure.strip(): value.strip() for figure, value in rows}


def printed_value(text: str) -> object:
    """A printed figure back as the summary holds it: yes/NO -> bool, ``1,234`` / ``1,234 B`` -> int."""
    if text in ("yes", "NO"):
        return text == "yes"
    number = text.removesuffix(" B").replace(",", "")
    return int(number) if number.isdigit() else text


def test_demo_table_prints_every_figure_of_the_summary(capsys):
    argv = ["demo", "--conversations", "2", "--turns", "1", "--max-new-tokens", "2"]
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    rows = printed_rows(capsys.readouterr().out)
    assert list(rows) == [key.replace("_", " ") for key in summary]
    for key, value in summary.items():
        assert printed_value(rows[key.replace("_", " ")]) == value, key
    assert rows["outputs match"] == rows["caches match"] == "yes"


def test_demo_pool_too_small_is_one_line_error(capsys):
    assert main(["demo", "--pages", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dsakv: error: --pages = 2") and err.count("\n") == 1


@pytest.mark.parametrize("flag, registry", [("--pool-kind", POOL_KINDS), ("--preemption", PREEMPTION_MODES)])
def test_demo_choice_flags_offer_exactly_their_registry(flag, registry, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse exits while parsing; the CLI makes it status 1
        main(["demo", flag, "swap"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    offered = re.search(r"\(choose from (.*)\)", err).group(1)
    assert sorted(choice.strip(" '") for choice in offered.split(",")) == sorted(registry)
    assert "swap" in err and err.count("\n") == 1


def test_demo_on_a_packed_pool_matches_the_reference(capsys):
    argv = ["demo", "--json", "--pool-kind", "packed", "--conversations", "3", "--max-new-tokens", "4"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match"] is True and out["caches_match"] is True
    assert out["evicted_tokens"] > 0 and out["hit_tokens"] > 0
