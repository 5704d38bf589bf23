"""Reading JSON that a user hands in (a ``config.json``, a pattern file, one trace line): every way it can be
wrong is one ``DsakvError`` line, never a ``UnicodeDecodeError``, ``RecursionError`` or the ``ValueError`` of
an over-long integer.

``parse_json(data, where)`` decodes UTF-8 and parses; ``read_json_file(path, what)`` reads at most
``MAX_JSON_FILE_BYTES`` first (a config is a few kilobytes; ``/dev/zero`` must not fill the memory) and
refuses an object that names one key twice (``json.loads`` would keep the last silently).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsakv.errors import DsakvError

MAX_JSON_FILE_BYTES = 16 * 2**20  # 16 MiB: configs and pattern files are a few kilobytes


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse_json(data: bytes | str, where: str, *, with_line: bool = True, unique_keys: bool = False) -> Any:
    """``json.loads`` whose failures raise ``DsakvError`` starting with ``where`` (``with_line=False``: the
    position is given as a column only, for one-line documents; ``unique_keys``: a key given twice in one
    object is an error)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DsakvError(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(data, object_pairs_hook=_unique_pairs if unique_keys else None)
    except _DuplicateKey as exc:
        raise DsakvError(f"{where}: not valid JSON (key {exc.args[0]!r} given twice in one object)") from None
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if with_line else f"column {exc.colno}"
        raise DsakvError(f"{where}: not valid JSON ({exc.msg} at {at})") from None
    except RecursionError:
        raise DsakvError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # an integer longer than sys.get_int_max_str_digits() digits
        raise DsakvError(f"{where}: not valid JSON ({str(exc).split(';')[0]})") from None


def read_json_file(path: str | Path, what: str) -> Any:
    """Read and parse a JSON file (no key twice in one object); errors name ``what`` and the path."""
    where = f"{what} {str(path)!r}"
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_JSON_FILE_BYTES + 1)
    except OSError as exc:
        raise DsakvError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_JSON_FILE_BYTES:
        raise DsakvError(f"{where}: larger than {MAX_JSON_FILE_BYTES:,} bytes; not a {what} file")
    return parse_json(data, where, unique_keys=True)


__all__ = ["MAX_JSON_FILE_BYTES", "parse_json", "read_json_file"]
