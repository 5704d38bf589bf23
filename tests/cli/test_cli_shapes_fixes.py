"""Small input fixes of issue 24: integer flags take ASCII digits only, and ``--skip-bad`` on a file with no
valid line is an error, not an empty run."""

from __future__ import annotations

import os

import pytest
from cli_checks import assert_one_line_error

from dsakv.cli import main

SIM = ["simulate", "--step-model", "constant", "--scenario", "chat", "--scale", "0.05"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        ([*SIM, "--indexer", "２１"], "--indexer"),  # full-width digits: int() and str.isdigit() take them as 21
        ([*SIM, "--indexer", "٢١"], "--indexer"),  # Arabic-Indic digits
        (["plan", "--kpool", "２"], "--kpool"),
        (["demo", "--pages", "１２"], "--pages"),
        (["generate", "--checkpoint", ".", "--prompt-ids", "1", "--max-new-tokens", "１６"], "--max-new-tokens"),
    ],
)
def test_integer_flags_take_ascii_digits_only(capsys, argv, flag):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a flag's type: exit status 1, one line
        code = exc.code
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1 and flag in err and "ASCII digits" in err
        return
    line = assert_one_line_error(code, capsys.readouterr().err)
    assert flag in line


def test_indexer_count_in_ascii_digits_still_works(capsys):
    assert main([*SIM, "--indexer", "21", "--json"]) == 0


def test_skip_bad_on_a_binary_file_is_an_error_not_an_empty_run(tmp_path, capsys):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(os.urandom(4096).replace(b"\n", b"\n\x00") + b"\n\xff\xfe\n")
    line = assert_one_line_error(
        main(["simulate", "--step-model", "constant", "--trace", str(path), "--skip-bad"]), capsys.readouterr().err
    )
    assert "none of its" in line and "valid request" in line


def test_an_empty_trace_is_still_nothing_to_simulate(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    assert main(["simulate", "--step-model", "constant", "--trace", str(path), "--skip-bad", "--json"]) == 0
    assert "nothing to simulate" in capsys.readouterr().out
