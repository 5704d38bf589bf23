"""The CLI's bad-input contract, shared by every subcommand: one line on stderr, exit status 1."""

import pytest

from dsakv.cli import COMMANDS, main


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


def test_every_command_is_registered():
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
