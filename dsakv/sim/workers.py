"""Tasks run in spawned worker processes, one each, with their progress, peak memory and CPU time, and their
errors raised in the parent (``dsakv.sim.shards`` runs a cluster's shards on them).

A task is a picklable callable ``task(progress) -> result`` (``progress(n)`` reports a count, or is None when
nobody listens); its result must pickle too. Each worker talks to the parent over one pipe::

    ("progress", n)*  then  ("done", peak RSS bytes, CPU seconds) + the pickled result
                       or   ("error", DsakvError message or None, traceback)

Workers are spawned, not forked: they inherit no thread of the parent (a progress bar's) and share no page
with it, so each worker's peak resident set (``getrusage``, measured after pickling its result) adds to the
parent's honestly. An error in one worker stops the others; a worker that dies without a word (killed, out
of memory) is an error naming its exit; a worker whose parent ends ends too. A script that starts workers
must run its work under ``if __name__ == "__main__":`` (each worker imports the script's module).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import resource
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from dsakv.errors import DsakvError

Task = Callable[[Callable[[int], None] | None], object]


@dataclass(frozen=True)
class WorkerRun:
    """Each task's result, and each worker's peak resident set in bytes and CPU seconds (user + system, its
    whole life: start, work, pickling), in the order of the tasks."""

    results: list
    peak_rss_bytes: tuple[int, ...]
    cpu_s: tuple[float, ...]


def run_in_workers(tasks: list[Task], progress: Callable[[int], None] | None = None) -> WorkerRun:
    """Run each task in a worker process of its own; ``progress`` gets the sum of the workers' latest counts.
    The first error is raised here (a ``DsakvError`` as such, anything else as a ``RuntimeError`` carrying the
    worker's traceback), once every worker has stopped."""
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    try:
        for k, task in enumerate(tasks):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_work, args=(task, writer, progress is not None), name=f"dsakv-worker-{k}")
            proc.start()
            writer.close()  # the worker's end: its death then reads as EOF here
            procs.append(proc)
            conns.append(reader)
        return _collect(procs, conns, progress)
    finally:
        for proc in procs:
            if proc.is_alive():  # an error in another worker, or Ctrl-C: stop this one
                proc.terminate()
            proc.join()
        for conn in conns:
            conn.close()


def _work(task: Task, conn: Connection, report: bool) -> None:
    """A worker: run the task, sending its progress, then its figures and result, or its error."""
    _exit_with_parent()
    try:
        progress = (lambda done: conn.send(("progress", done))) if report else None
        data = pickle.dumps(task(progress), protocol=pickle.HIGHEST_PROTOCOL)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        conn.send(("done", usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime))  # maxrss in KiB on Linux
        conn.send_bytes(data)
    except DsakvError as exc:
        _send_error(conn, ("error", str(exc), ""))
    except BaseException:  # a bug (or Ctrl-C): the parent raises it with this traceback
        _send_error(conn, ("error", None, traceback.format_exc()))
    finally:
        conn.close()


def _exit_with_parent() -> None:
    """End this worker when its parent ends (killed, say): its result would have nowhere to go. A thread
    waits on the parent's sentinel (blocked in the kernel, it costs the work nothing)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), name="dsakv-parent-watch", daemon=True).start()


def _send_error(conn: Connection, message: tuple) -> None:
    """Send a worker's error unless the parent has gone (it stopped on another worker's error, or Ctrl-C)."""
    with contextlib.suppress(OSError):
        conn.send(message)


def _collect(
    procs: list[multiprocessing.Process], conns: list[Connection], progress: Callable[[int], None] | None
) -> WorkerRun:
    """Every worker's result, peak RSS and CPU seconds, forwarding progress meanwhile; the first error is raised."""
    n = len(conns)
    results: list = [None] * n
    peaks, cpu, done = [0] * n, [0.0] * n, [0] * n
    waiting = {conn: k for k, conn in enumerate(conns)}
    while waiting:
        for conn in wait(list(waiting)):
            k = waiting[conn]
            try:
                message = conn.recv()
            except EOFError:
                procs[k].join()
                code = procs[k].exitcode
                how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
                hint = {
                    -signal.SIGKILL: " (out of memory?)",
                    1: " (a script that starts workers must run under `if __name__ == '__main__':`)",
                }
                raise DsakvError(
                    f"workers: worker {k} of {n} {how} before sending its figures{hint.get(code, '')}"
                ) from None
            if message[0] == "progress":
                done[k] = message[1]
                if progress is not None:
                    progress(sum(done))
            elif message[0] == "done":
                _, peaks[k], cpu[k] = message
                results[k] = pickle.loads(conn.recv_bytes())
                del waiting[conn]
            else:
                _, error, trace = message
                if error is not None:
                    raise DsakvError(error)
                raise RuntimeError(f"worker {k} of {n} failed:\n{trace}")
    return WorkerRun(results, tuple(peaks), tuple(cpu))
