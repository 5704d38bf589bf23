"""Error types. Every bad-input error names the field, the value and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterable

INT64_MAX = 2**63 - 1  # counts and byte sizes stay in a signed 64-bit integer, as in numpy and the engines


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


def short_repr(value: object, limit: int = 48) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters (a 400-digit number, a long
    string); an integer too long to print whole is shown as its leading digits and its digit count."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"
