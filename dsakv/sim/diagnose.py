"""``dsakv diagnose``: the four verdicts an engine's own log supports, each with its figures, what dsakv expects
(the planner and the step-time model of the same setting) and the knob to change. docs/diagnose.md.

* ``pool_size``: the logged pool against the plan; ``dsakv.planner.diagnose.explain_tokens`` names the knob that
  reproduces it exactly (indexer schedule, DCP, MTP, KV dtype, kpool, or two of them).
* ``long_request_admission``: requests still queued at a decode step (SGLang admits prefills first, so a request
  waiting then could not be admitted) or a vLLM stats line while the pool had room (``LogFacts.queued_free_lines``): pages
  are reserved up front (``ceil(L / 64)`` a request), so tokens can be free while no request's pages fit.
* ``hit_without_ttft_gain``: a high prefix hit rate whose prefill saving (the step-time model's prefill of the
  log's mean request, its mean hit before its mean new tokens, with and without the hit) falls below 70 % of it: short hits with long suffixes, where the
  suffix still scores the whole prefix (the P x S cross term).
* ``decode_linear_in_context``: decode step time fitted as ``a + b x running + c x context tokens``; fires when
  the context term is at least ``CONTEXT_SHARE`` of the median step (the indexer reads every context key's
  132 B on every full layer each step; batching does not amortise it).

``fires`` is None when the log lacks the lines a verdict needs; its advice then says which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dsakv.errors import DsakvError
from dsakv.planner.diagnose import explain_tokens
from dsakv.sim.config import SimConfig, SimSetup
from dsakv.spec.patterns import indexer_patterns
from dsakv.telemetry.log_lines import PoolLine
from dsakv.telemetry.log_reader import LogFacts
from dsakv.telemetry.metrics_text import MetricFacts

VERDICTS = ("pool_size", "long_request_admission", "hit_without_ttft_gain", "decode_linear_in_context")
MIN_QUEUED_FREE_LINES = 3
MIN_HIT_RATE = 0.2
SAVING_SHORTFALL = 0.7  # fires when the prefill saving is below this share of the hit rate
CONTEXT_SHARE = 0.25
MIN_DECODE_POINTS = 8
CELL_RATIO_LIMIT = 2.0  # a logged per-token size this far from the model's: another model's log
KNOB_HINTS = {  # explain_tokens' knobs -> where an operator sets them
    "indexer schedule": "the checkpoint's indexer schedule (config.json indexer_types, index_topk_pattern or "
    "index_topk_freq + index_skip_topk_offset)",
    "dcp": "the decode-context-parallel size (the indexer K is replicated on every DCP rank)",
    "mtp": "the MTP cache layers (speculative decoding's draft layer)",
    "kv dtype": "the KV cache dtype (--kv-cache-dtype)",
    "kpool": "index_kpool",
}


@dataclass(frozen=True)
class Verdict:
    name: str
    fires: bool | None
    figures: dict
    advice: str

    def to_dict(self) -> dict:
        return {"name": self.name, "fires": self.fires, "figures": self.figures, "advice": self.advice}


def _check_model(facts: LogFacts, setup: SimSetup) -> None:
    """A log of another model (an MHA pool, or a per-token size far from this model's cell) is an error."""
    if facts.mha_pool:
        raise DsakvError(
            f"--log {facts.path}: the engine allocated a K/V (MHA) pool, not an MLA + indexer pool: "
            "a log of another model (this one is DSA: --model / --config)"
        )
    if facts.pool is None or facts.pool_kv_bytes is None or not facts.pool.tokens:
        return
    logged = facts.pool_kv_bytes / facts.pool.tokens
    expected = setup.cell.page_bytes / setup.cell.group_page_tokens
    if not 1 / CELL_RATIO_LIMIT <= logged / expected <= CELL_RATIO_LIMIT:
        raise DsakvError(
            f"--log {facts.path}: the pool holds {logged:,.0f} B per token on a rank; {setup.spec.name} stores "
            f"{expected:,.0f}: a log of another model? (--model / --config)"
        )


def pool_size(facts: LogFacts, cfg: SimConfig, setup: SimSetup) -> Verdict:
    if facts.pool is None:
        return Verdict(
            "pool_size",
            None,
            {},
            "not enough data: needs the pool line (SGLang 'KV Cache is allocated. … #tokens' or "
            "'max_total_num_tokens=', vLLM 'GPU KV cache size: … tokens')",
        )
    setting = None if cfg.available_bytes is not None else setup.setting
    ex = explain_tokens(  # the simulator's own layout, so the expected pool is the one dsakv simulate runs
        facts.pool.tokens,
        setup.layout,
        setting=setting,
        available_bytes=cfg.available_bytes,
        dcp=setup.setting.dcp,
        patterns=indexer_patterns(),
    )
    figures = {
        "logged_tokens": ex.logged_tokens,
        "expected_tokens": ex.planned_tokens,
        "gap_tokens": ex.gap_tokens,
        "gap_share": ex.gap_tokens / ex.planned_tokens if ex.planned_tokens else None,
        "expected_cell_bytes": setup.cell.cell_bytes,
        "logged_bytes_per_token": None if facts.pool_kv_bytes is None else facts.pool_kv_bytes / facts.pool.tokens,
        "explained_by": [c.label for c in ex.candidates if c.exact],
        "candidates": [c.to_dict() for c in ex.candidates],
    }
    if ex.gap_tokens == 0:
        return Verdict("pool_size", False, figures, f"{ex.verdict}: nothing to change")
    if ex.explained:
        best = next(c for c in ex.candidates if c.exact)
        configured = f" (configured: {setup.spec.num_full_indexer_layers} full indexer layers, DCP {setup.setting.dcp})"
        advice = (
            f"{best.label}{configured} explains the pool exactly: {ex.logged_tokens:,} tokens, "
            f"{ex.gap_tokens / ex.planned_tokens:+.1%} vs the plan's {ex.planned_tokens:,}; check "
            + "; ".join(KNOB_HINTS.get(k, k) for k in best.changes)
        )
    else:
        advice = ex.verdict
    return Verdict("pool_size", True, figures, advice)


def long_request_admission(facts: LogFacts, setup: SimSetup) -> Verdict:
    if facts.queued_lines == 0 and facts.prefill_lines + facts.decode_lines + facts.stats_lines == 0:
        return Verdict(
            "long_request_admission",
            None,
            {},
            "not enough data: needs batch lines with the queue and the pool's usage (SGLang 'Prefill batch' / "
            "'Decode batch' #queue-req and token usage, or vLLM's stats line Waiting and GPU KV cache usage)",
        )
    pool = facts.pool.tokens if facts.pool is not None else setup.num_pages * setup.group_page_tokens
    free = None if facts.queued_min_usage is None else round((1 - facts.queued_min_usage) * pool)
    context = facts.context_len or setup.spec.max_position_embeddings
    page = setup.group_page_tokens
    figures = {
        "queued_lines": facts.queued_lines,
        "queued_while_free_lines": facts.queued_free_lines,
        "lowest_usage_while_queued": facts.queued_min_usage,
        "free_tokens_while_queued": free,
        "expected_reservation_tokens_at_context_limit": -(-context // page) * page,
        "pool_tokens": pool,
    }
    fires = facts.queued_free_lines >= MIN_QUEUED_FREE_LINES
    if not fires:
        return Verdict(
            "long_request_admission", False, figures, "requests queued only with the pool nearly full (or never)"
        )
    advice = (
        f"requests waited in {facts.queued_free_lines:,} lines while the pool was at most 90 % used (up to {free:,} "
        f"tokens free): pages are reserved up front, ceil(L / {page}) a request, so long requests' reservations "
        "hold pages that tokens do not fill; knobs: the reservation of the output (SGLang --schedule-conservativeness"
        " / init_new_token_ratio, dsakv --new-token-ratio), a shorter --context-length, or long requests on their "
        "own instance"
    )
    return Verdict("long_request_admission", True, figures, advice)


def _prefill_saving(facts: LogFacts, setup: SimSetup) -> tuple[float, float, float] | None:
    """(expected saving, mean hit, mean suffix): the step-time model's prefill of the log's mean request (its mean
    hit before its mean new tokens: chunks add up, so the whole log's sums are used) against the same request
    with no hit."""
    if not facts.hit_seqs or not facts.new_seqs:
        return None
    hit = facts.cached_tokens / facts.hit_seqs
    suffix = facts.new_tokens / facts.new_seqs
    st = setup.step_time
    with_hit = st.step_seconds([(max(round(suffix), 1), round(hit))], [])
    cold = st.step_seconds([(round(hit + suffix), 0)], [])
    return 1 - with_hit / cold, hit, suffix


def hit_without_ttft_gain(facts: LogFacts, metrics: MetricFacts | None, setup: SimSetup) -> Verdict:
    rate = facts.hit_rate if facts.hit_rate is not None else (metrics.hit_rate if metrics else None)
    saving = _prefill_saving(facts, setup)
    figures = {"hit_rate": rate, "ttft_mean_s": None if metrics is None else metrics.ttft_mean_s}
    if saving is None:
        why = "no prefill batch with cached tokens" if facts.prefill_lines else "no prefill batch line"
        return Verdict(
            "hit_without_ttft_gain",
            None,
            figures,
            f"not enough data: needs SGLang 'Prefill batch' lines with #new-token and #cached-token ({why})",
        )
    expected, mean_hit, mean_suffix = saving
    hit_rate = facts.cached_tokens / (facts.cached_tokens + facts.new_tokens)
    cross = mean_hit * mean_suffix / ((mean_hit + mean_suffix) ** 2 / 2)
    figures.update(
        expected_prefill_saving=expected,
        mean_hit_tokens=mean_hit,
        mean_suffix_tokens=mean_suffix,
        cross_term_share_of_indexer_pairs=cross,
    )
    rate = hit_rate if rate is None else rate
    if rate < MIN_HIT_RATE:
        return Verdict("hit_without_ttft_gain", False, figures, f"hit rate {rate:.0%}: below {MIN_HIT_RATE:.0%}")
    if expected >= SAVING_SHORTFALL * hit_rate:
        return Verdict(
            "hit_without_ttft_gain",
            False,
            figures,
            f"hits save {expected:.0%} of prefill time at a {hit_rate:.0%} token hit rate: the hits pay off",
        )
    advice = (
        f"{hit_rate:.0%} of the prompt tokens hit, yet the hits save only {expected:.0%} of prefill time: hits of "
        f"{mean_hit:,.0f} tokens before {mean_suffix:,.0f}-token suffixes, whose queries still score every prefix "
        f"key (P x S = {cross:.0%} of the indexer pairs); knobs: put the shared content first so hits grow "
        "(longer page-aligned prefixes), route by prefix (--router kv-aware), or expect TTFT from the suffix length"
    )
    return Verdict("hit_without_ttft_gain", True, figures, advice)


def _decode_points(facts: LogFacts, setup: SimSetup) -> np.ndarray:
    """(running, context tokens, step seconds) per decode observation: SGLang decode lines whose gap held decode
    steps only (a prefill between two decode lines is not a decode step's time), else vLLM stats lines."""
    rows = [
        (g.steps[0][1], g.steps[0][2], g.seconds / g.steps[0][3])
        for g in facts.gaps.items
        if g.kind == "decode" and len(g.steps) == 1
    ]
    if not rows and facts.pool is not None:
        pool = facts.pool.tokens
        rows = [
            (s.running, s.usage * pool, s.running / s.gen_throughput)
            for s in facts.stats.items
            if s.gen_throughput > 0 and s.running and s.usage is not None and s.prompt_throughput <= s.gen_throughput
        ]
    return np.array(rows, dtype=float).reshape(-1, 3)


def decode_linear_in_context(facts: LogFacts, setup: SimSetup) -> Verdict:
    pts = _decode_points(facts, setup)
    need = (
        f"not enough data: needs at least {MIN_DECODE_POINTS} decode observations whose context per request varies "
        "1.5x or more "
        "(SGLang 'Decode batch' #token and gen throughput, or vLLM stats lines with GPU KV cache usage)"
    )
    per_request = pts[:, 1] / np.maximum(pts[:, 0], 1)
    if len(pts) < MIN_DECODE_POINTS or per_request.max() < 1.5 * max(per_request.min(), 1):
        return Verdict("decode_linear_in_context", None, {"decode_points": len(pts)}, need)
    x = np.column_stack([np.ones(len(pts)), pts[:, 0], pts[:, 1]])
    coef, *_ = np.linalg.lstsq(x, pts[:, 2], rcond=None)
    n_med, t_med, s_med = (float(np.median(pts[:, i])) for i in range(3))
    share = max(float(coef[2]) * t_med / s_med, 0.0)
    st, cell = setup.step_time, setup.cell
    ctx = max(int(t_med / max(n_med, 1)), 1)
    n = max(int(n_med), 1)
    delta = 1024
    expected = (st.step_seconds([], [ctx + delta] * n) - st.step_seconds([], [ctx] * n)) / (n * delta)
    figures = {
        "decode_points": len(pts),
        "seconds_per_step_base": coef[0],
        "seconds_per_running_request": coef[1],
        "seconds_per_context_token": coef[2],
        "context_share_of_median_step": share,
        "median_step_s": s_med,
        "median_context_tokens": t_med,
        "expected_seconds_per_context_token": expected,
        "indexer_bytes_per_context_token": cell.indexer_bytes_per_token,
        "full_indexer_layers": setup.spec.num_full_indexer_layers,
    }
    if share < CONTEXT_SHARE:
        return Verdict(
            "decode_linear_in_context",
            False,
            figures,
            f"context accounts for {share:.0%} of the median decode step: the step is weight / batch bound",
        )
    advice = (
        f"decode steps grow {coef[2] * 1e9:,.1f} ns per context token ({share:.0%} of the median step; dsakv expects "
        f"{expected * 1e9:,.1f} ns): every step reads each context key's indexer K "
        f"({cell.indexer_bytes_per_token:,} B a token over {setup.spec.num_full_indexer_layers} full layers) and its "
        "top-k latent rows, which batching does not amortise; knobs: fewer full indexer layers (an IndexCache "
        "pattern, --indexer-pattern), index_kpool = 2, shorter contexts per instance"
    )
    return Verdict("decode_linear_in_context", True, figures, advice)


def diagnose(facts: LogFacts, metrics: MetricFacts | None, cfg: SimConfig, setup: SimSetup) -> tuple[Verdict, ...]:
    """The four verdicts (``VERDICTS`` order); ``DsakvError`` for a log of another model or with no engine line."""
    if facts.engine is None:
        raise DsakvError(
            f"--log {facts.path}: no SGLang or vLLM line in {facts.lines:,} lines ({facts.ignored_lines:,} ignored, "
            f"{facts.malformed_lines:,} malformed)"
        )
    _check_model(facts, setup)
    if facts.pool is None and metrics is not None and metrics.pool_tokens:  # the scrape's pool, when the log has none
        facts = replace(facts, pool=PoolLine("metrics", metrics.pool_tokens))
    return (
        pool_size(facts, cfg, setup),
        long_request_admission(facts, setup),
        hit_without_ttft_gain(facts, metrics, setup),
        decode_linear_in_context(facts, setup),
    )


__all__ = ["VERDICTS", "Verdict", "diagnose"]
