"""The CLI's bad-input contract, shared by every subcommand: one line on stderr, exit status 1."""

import importlib

import pytest

from dsakv.cli import COMMANDS, build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--preemption", "bogus"],
        ["plan", "--bogus-flag"],
        ["simulate", "--policy", "no-such-policy"],
        [],
    ],
)
def test_argument_errors_exit_1_with_one_line(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and "Traceback" not in err[0]


def test_every_command_runs_its_own_module_and_has_its_own_help(capsys):
    parser = build_parser()
    for name in COMMANDS:
        assert parser.parse_args([name])._run is importlib.import_module(f"dsakv.cli.{name}").run
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: dsakv {name} ")
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("    ") and not line.startswith("     ")]
    assert listed == list(COMMANDS)  # the top-level help lists every command, in order
