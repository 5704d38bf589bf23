"""Error types. Every bad-input error names the field, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable


class DsakvError(ValueError):
    """Bad input: a one-line message naming the field and the allowed values.

    The CLI prints it as ``dsakv: error: <message>`` and exits with status 1.
    """


class OutOfPagesError(DsakvError):
    """An allocation asked for more pages than are free; nothing was allocated."""


def check_choice(field: str, value: object, choices: Iterable[str]) -> None:
    """The one check (and wording) of every name registry: ``field = 'x': must be one of a, b, c``."""
    names = tuple(choices)
    if not isinstance(value, str) or value not in names:
        raise DsakvError(f"{field} = {value!r}: must be one of {', '.join(names)}")
