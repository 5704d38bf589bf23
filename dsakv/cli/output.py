"""What the commands write: JSON without ``NaN`` or ``Infinity``, and ``--out`` folders written all or nothing.

``dumps`` is ``json.dumps`` with every non-finite float written as ``null`` (``allow_nan=False`` proves
none slips through). ``OutputDir`` is the life of one ``--out DIR``::

    OutputDir(DIR, names)   check DIR, create the hidden sibling .DIR.partial-<pid>-<random>   (before the run)
    .path / name            the files are written there
    .commit()               rename it to DIR (a previous run's DIR is moved aside, then removed)
    .discard()              remove it (an error, Ctrl-C, SIGTERM): DIR stays as it was

so a run that is killed never leaves a ``DIR`` that looks complete, a rerun never leaves the previous run's
plots beside new figures, and every problem with the destination (a file where the folder should be, a
folder that holds other files, no permission) is reported before the simulation starts. ``DIR`` is replaced
only when it is empty or holds nothing but files these commands write; anything else is refused.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dsakv.errors import DsakvError


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-Infinity) replaced by None, in dicts and lists at any depth."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """JSON text of ``obj``; non-finite floats become ``null`` (JSON has no NaN or Infinity)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def _oserror(exc: OSError) -> str:
    return exc.strerror or str(exc)


class OutputDir:
    """One ``--out DIR`` that may hold the files ``names`` (see the module docstring); use it as a context
    manager so that leaving the block without ``commit`` discards the partial folder."""

    def __init__(self, out: str | Path, names: Iterable[str]) -> None:
        self.flag = f"--out {str(out)!r}"
        self.names = frozenset(names)
        self.final = Path(os.path.abspath(out))
        if not self.final.name:
            raise DsakvError(f"{self.flag}: must name a folder to create or replace, not the root")
        self._check_final()
        parent = self.final.parent
        self._made: list[Path] = []  # ancestors this object created (removed again on discard)
        missing = []
        for p in (parent, *parent.parents):
            if p.exists() or p.is_symlink():
                if not p.is_dir():
                    raise DsakvError(f"{self.flag}: {str(p)!r} is not a folder")
                break
            missing.append(p)
        try:
            for p in reversed(missing):
                p.mkdir()
                self._made.append(p)
            self.path = parent / f".{self.final.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
            self.path.mkdir()
        except OSError as exc:
            self._remove_made()
            raise DsakvError(f"{self.flag}: cannot create a folder in {str(parent)!r} ({_oserror(exc)})") from None
        self.committed = False

    def _check_final(self) -> None:
        """``DsakvError`` unless DIR is absent, or a folder holding only regular files named in ``names``."""
        final = self.final
        cwd = Path(os.path.abspath(os.curdir))
        if final == cwd or final in cwd.parents:  # replacing it would pull the folder from under the shell
            raise DsakvError(f"{self.flag}: is the current folder or holds it; give a folder inside it")
        if final.is_symlink():
            raise DsakvError(f"{self.flag}: is a symbolic link; give the folder itself")
        if not final.exists():
            return
        if not final.is_dir():
            raise DsakvError(f"{self.flag}: exists and is not a folder")
        try:
            entries = sorted(final.iterdir())
        except OSError as exc:
            raise DsakvError(f"{self.flag}: cannot list the folder ({_oserror(exc)})") from None
        for entry in entries:
            if entry.name not in self.names or entry.is_symlink() or not entry.is_file():
                raise DsakvError(
                    f"{self.flag}: holds {entry.name!r}, which dsakv does not write there; "
                    f"give a new or empty folder (a previous run's folder is replaced whole)"
                )

    def write_text(self, name: str, text: str) -> None:
        """Write one file of the run into the partial folder (``DsakvError`` naming it if that fails)."""
        try:
            (self.path / name).write_text(text)
        except OSError as exc:
            raise DsakvError(f"{self.flag}: cannot write {name} ({_oserror(exc)})") from None

    def commit(self) -> None:
        """Put the finished folder in place of DIR."""
        self._check_final()  # the run may have taken hours: look again before replacing anything
        final, old = self.final, None
        try:
            if final.exists():
                old = final.parent / f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
                final.rename(old)
            self.path.rename(final)
        except OSError as exc:
            if old is not None and not final.exists():
                old.rename(final)
            raise DsakvError(f"{self.flag}: cannot move the finished folder into place ({_oserror(exc)})") from None
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Remove the partial folder (and the parents this object created); DIR is left as it was."""
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)
            self._remove_made()
            self.committed = True  # nothing left to do

    def _remove_made(self) -> None:
        for p in reversed(self._made):
            try:
                p.rmdir()
            except OSError:
                break
        self._made = []

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.discard()


__all__ = ["OutputDir", "dumps", "finite"]
