"""The scheduler's name registries: preemption modes (what happens to a victim's two caches), victim orders
(who is preempted first) and requeue positions (where a victim waits). ``SchedulerConfig`` validates its names
here; ``preemption.take_pages`` picks victims with ``pick_victim``.

Modes (``PREEMPTION_MODES``; carried out in ``dsakv.scheduler.preemption``):

* ``recompute`` -- the victim's page-aligned computed tokens are inserted into the prefix cache (when there
  is one), its own duplicate pages and its unaligned tail are freed (both caches together), its lock is
  dropped, and it goes back to the waiting queue (``requeue``) with its tokens so far. On resume it is
  re-admitted like a new request and re-prefills, hitting its own cached prefix if nobody evicted it.
* ``offload`` -- every page of the victim (shared prefix pages included) is copied to host, both caches of
  each page together, then its own pages are freed and its lock dropped. On resume new pages are allocated
  and the host bytes restored into them bit-exact; it continues where it stopped, computing nothing again.

Victim orders (``VICTIM_ORDERS``), applied to running requests other than the one that needs pages and
those already scheduled in the current step:

* ``newest`` (default; vLLM) -- the most recently admitted request first: it has done the least work.
* ``fewest_outputs`` (SGLang's retract order) -- fewest generated tokens first, then the longest prompt, then
  the most recently admitted (``ScheduleBatch.retract_decode`` sorts the batch by (outputs, -prompt) descending
  and pops from the end).
* ``most_pages`` -- the request holding the most pages first: frees the most memory per preemption.

Requeue positions (``REQUEUE_POSITIONS``): where a preempted request re-enters the waiting queue.

* ``front`` (default; vLLM) -- before every waiting request: it is admitted again first
  (``Scheduler.schedule``: ``self.running.pop()``, then ``self.waiting.prepend_request``).
* ``back`` (SGLang) -- after them, like a new arrival: the requests already waiting are admitted before it
  (``Scheduler._add_request_to_queue`` appends a retracted request, and the default ``fcfs`` policy does not
  reorder the queue).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dsakv.errors import check_choice
from dsakv.scheduler.request import Request

PREEMPTION_MODES: dict[str, str] = {
    "recompute": "free both caches; resume re-prefills, hitting its own cached prefix if still there",
    "offload": "copy both caches of its pages to host, free them; resume restores them bit-exact into new pages",
}


def _newest(candidates: list[Request]) -> list[Request]:
    return candidates[::-1]


def _fewest_outputs(candidates: list[Request]) -> list[Request]:
    return sorted(candidates[::-1], key=lambda r: (len(r.outputs), -r.prompt_len))


def _most_pages(candidates: list[Request]) -> list[Request]:
    return sorted(candidates, key=lambda r: -len(r.owned_pages))


VICTIM_ORDERS: dict[str, Callable[[list[Request]], list[Request]]] = {
    "newest": _newest,
    "fewest_outputs": _fewest_outputs,
    "most_pages": _most_pages,
}


REQUEUE_POSITIONS: dict[str, str] = {
    "front": "before every waiting request (vLLM)",
    "back": "after every waiting request, like a new arrival (SGLang)",
}


def check_mode(name: str) -> str:
    check_choice("preemption", name, PREEMPTION_MODES)
    return name


def check_victim_order(name: str) -> str:
    check_choice("victim_order", name, VICTIM_ORDERS)
    return name


def check_requeue(name: str) -> str:
    check_choice("requeue", name, REQUEUE_POSITIONS)
    return name


def pick_victim(order: str, running: Iterable[Request], exclude: set[int]) -> Request | None:
    """The first request in ``order`` among ``running`` whose ``id(request)`` is not in ``exclude``."""
    candidates = [r for r in running if id(r) not in exclude]
    if not candidates:
        return None
    return VICTIM_ORDERS[order](candidates)[0]
