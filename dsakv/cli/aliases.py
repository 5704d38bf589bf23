"""Old flag spellings kept as hidden aliases: ``--mtp`` for ``--num-speculative-tokens``, ``--indexer`` for
``--indexer-pattern``, ``--write-threshold`` for ``--hit-threshold``, ``--kv-events`` for
``--kv-events-endpoint``, ``--kv-events-replay`` for ``--kv-events-replay-endpoint``, ``--no-moe-deep-gemm`` for
leaving out ``--moe-deep-gemm`` (the default since docs/steptime.md fact 36's correction). An alias parses to the
same destination as its flag and is left out of ``--help``; the library API keeps one name."""

from __future__ import annotations

import argparse


def add_hidden_alias(group, alias: str, dest: str, **kwargs) -> None:
    """``alias`` sets ``dest`` like the flag it stands for (pass the flag's ``type`` / ``action``); not shown in
    ``--help``, and no default of its own (the flag's default stays)."""
    group.add_argument(alias, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


__all__ = ["add_hidden_alias"]
