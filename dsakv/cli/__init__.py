"""``dsakv`` command line: one console script, one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
raises ``DsakvError``; it is printed as one line and the exit status is 1 (130 on Ctrl-C, 143 on SIGTERM:
both unwind the stack, so a partial ``--out`` folder is removed on the way).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import NoReturn

from dsakv.errors import DsakvError

COMMANDS = ("plan", "demo", "simulate", "generate", "diagnose", "calibrate")


class _Parser(argparse.ArgumentParser):
    """argparse with the project's bad-input contract: one line on stderr, exit status 1 (not argparse's 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dsakv", description="KV cache manager for DeepSeek-Sparse-Attention models")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"dsakv.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt so that cleanups run."""


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return int(args._run(args) or 0)
    except DsakvError as exc:
        print(f"dsakv: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dsakv: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("dsakv: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        return 0
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


if __name__ == "__main__":
    sys.exit(main())
