"""Error types. Every bad-input error names the field, the value and what is allowed."""


class DsakvError(ValueError):
    """Bad input: a one-line message naming the field and the allowed values.

    The CLI prints it as ``dsakv: error: <message>`` and exits with status 1.
    """


class OutOfPagesError(DsakvError):
    """An allocation asked for more pages than are free; nothing was allocated."""
