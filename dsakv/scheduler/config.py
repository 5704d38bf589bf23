"""``SchedulerConfig``: the scheduler's knobs, validated once when the config is built."""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError, check_choice
from dsakv.scheduler.policies import check_mode, check_requeue, check_victim_order

# mixed: running requests first (decodes and chunks), then admissions, in one batch (vLLM's scheduler);
# prefill_first: a step with prefill work runs only prefill chunks, decodes wait for a step without (SGLang's).
SCHEDULE_POLICIES = ("mixed", "prefill_first")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DsakvError(f"{name} = {value!r}: must be a positive integer")


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs. ``chunk_tokens`` must be a multiple of the page size (``check_page_size``, called by
    the scheduler once it knows the allocator)."""

    max_batched_tokens: int = 2048  # tokens computed per step, prefill chunks and decodes together
    chunk_tokens: int = 512  # largest prefill chunk of one request in one step
    max_running: int = 256  # requests holding pages at once
    max_context: int | None = None  # context limit in tokens (prompt + max_new_tokens); None: the pool decides
    new_token_ratio: float = 0.7  # share of the remaining max_new_tokens in the admission estimate
    # most remaining output tokens the estimate counts, before the ratio (SGLang's
    # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, 4096); None: all of them
    new_token_clip: int | None = None
    # SGLang's NewTokenRatioTracker: the ratio starts at new_token_ratio and, every decode step without a
    # preemption, drops by (new_token_ratio - new_token_ratio_min) / new_token_ratio_decay_steps down to
    # new_token_ratio_min; a preemption sets it to (outputs + retract_decode_steps per request) / (max_new_tokens
    # + 1) over the requests left running; an idle step resets it. A new request is then checked at its whole
    # (clipped) output, running ones at the current ratio (dsakv.scheduler.admission). None: a constant ratio.
    new_token_ratio_min: float | None = None
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    preemption: str = "recompute"  # see dsakv.scheduler.policies.PREEMPTION_MODES
    victim_order: str = "newest"  # see dsakv.scheduler.policies.VICTIM_ORDERS
    requeue: str = "front"  # where a preempted request waits: see dsakv.scheduler.policies.REQUEUE_POSITIONS
    # speculative decoding: k draft tokens proposed and verified per decode step (vLLM's num_speculative_tokens;
    # SGLang's speculative_num_steps for a chain); 0: off
    num_speculative_tokens: int = 0
    schedule_policy: str = "mixed"  # see SCHEDULE_POLICIES

    def __post_init__(self) -> None:
        _positive_int("max_batched_tokens", self.max_batched_tokens)
        _positive_int("chunk_tokens", self.chunk_tokens)
        _positive_int("max_running", self.max_running)
        if self.max_context is not None:
            _positive_int("max_context", self.max_context)
        ratio = self.new_token_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
            raise DsakvError(f"new_token_ratio = {ratio!r}: must be a number in [0, 1]")
        if self.new_token_clip is not None:
            _positive_int("new_token_clip", self.new_token_clip)
        low = self.new_token_ratio_min
        if low is not None and (isinstance(low, bool) or not isinstance(low, int | float) or not 0.0 <= low <= ratio):
            raise DsakvError(
                f"new_token_ratio_min = {low!r}: must be None (a constant ratio) or a number in [0, new_token_ratio "
                f"= {ratio}]"
            )
        _positive_int("new_token_ratio_decay_steps", self.new_token_ratio_decay_steps)
        _positive_int("retract_decode_steps", self.retract_decode_steps)
        check_mode(self.preemption)
        check_victim_order(self.victim_order)
        check_requeue(self.requeue)
        check_choice("schedule_policy", self.schedule_policy, SCHEDULE_POLICIES)
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DsakvError(f"num_speculative_tokens = {k!r}: must be an integer >= 0")
        if self.max_batched_tokens < 1 + k:
            raise DsakvError(
                f"max_batched_tokens = {self.max_batched_tokens}: must be >= 1 + num_speculative_tokens ({1 + k})"
            )

    def check_page_size(self, page_size: int) -> None:
        if self.chunk_tokens % page_size:
            raise DsakvError(f"chunk_tokens = {self.chunk_tokens}: must be a multiple of the page size {page_size}")
        if self.max_batched_tokens < page_size:
            raise DsakvError(f"max_batched_tokens = {self.max_batched_tokens}: must be >= the page size {page_size}")
