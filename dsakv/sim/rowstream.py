"""Per-request rows written as requests leave the simulation, in request-id order.

A run's request ids are its arrival serials (``0, 1, 2, ...``, one per request the run takes, in the single
loop and in a cluster alike), and the rows a run has always written (``--out DIR/requests.jsonl``) are sorted
by them. Requests leave in finish order, so ``RowStream`` holds a row only while a request with a smaller id
is still in the simulation: a row is formatted when its request leaves, kept (as its text) until every
smaller id has left, then appended to the file. The file is byte for byte what formatting the sorted
``RecordTable`` at the end gives (``tests/sim/test_sim_streaming.py``), and the rows waiting cost their text, not
a ``RequestRecord`` each; the summary still comes from the run's ``RecordTable``.

The stream writes to a file its caller opened (and closes): it creates nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from dsakv.errors import DsakvError
from dsakv.sim.report import RequestRecord


class RowStream:
    """Appends ``format_row(record)`` to ``file`` for each record fed to it, in id order (see the module
    docstring). ``add`` is the simulation's record sink; ``close`` writes the rows still held (in id order:
    only a run whose ids are not consecutive leaves any) and flushes the file, which stays open. A write that
    fails raises ``DsakvError`` naming ``what`` (the file, as the user gave it)."""

    def __init__(self, file: IO[str], format_row: Callable[[RequestRecord], str], what: str) -> None:
        self.file, self.format_row, self.what = file, format_row, what
        self.next_id = 0  # the smallest id not written yet
        self.held: dict[int, str] = {}  # id -> its row, while a smaller id is still in the simulation
        self.rows_written = 0

    def add(self, record: RequestRecord) -> None:
        """The row of a request that left the simulation (each id once)."""
        row = self.format_row(record)
        if record.id != self.next_id:
            self.held[record.id] = row
            return
        rows = [row]
        next_id, held = record.id + 1, self.held
        while next_id in held:
            rows.append(held.pop(next_id))
            next_id += 1
        self.next_id = next_id
        self._write(rows)

    def close(self) -> None:
        """Write the rows still held, in id order, and flush the file."""
        rows = [self.held[i] for i in sorted(self.held)]
        self.held = {}
        self._write(rows)
        try:
            self.file.flush()
        except OSError as exc:
            raise DsakvError(f"{self.what}: cannot write ({exc.strerror or exc})") from None

    def _write(self, rows: list[str]) -> None:
        try:
            self.file.writelines(rows)
        except OSError as exc:
            raise DsakvError(f"{self.what}: cannot write ({exc.strerror or exc})") from None
        self.rows_written += len(rows)


__all__ = ["RowStream"]
