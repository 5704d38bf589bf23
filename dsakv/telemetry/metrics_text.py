"""A Prometheus text scrape of vLLM (``vllm:``) or SGLang (``sglang:``) read with ``prometheus_client``'s parser.

``read_metrics(path)`` streams the file through ``text_fd_to_metric_families`` and keeps the figures the
diagnoses use, summed over label sets (several engines or ranks in one scrape add up):

=====================================================  =========================================================
figure                                                 metric (vLLM / SGLang)
=====================================================  =========================================================
``ttft_sum_s`` / ``ttft_count``                        ``vllm:time_to_first_token_seconds`` /
                                                       ``sglang:time_to_first_token_seconds`` (histogram)
``prefix_queries`` / ``prefix_hits`` (tokens)          ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
``cache_hit_rate``                                     ``sglang:cache_hit_rate`` (gauge)
``prompt_tokens`` / ``cached_tokens``                  ``vllm:prompt_tokens`` / ``sglang:prompt_tokens``,
                                                       ``sglang:cached_tokens``
``pool_tokens``                                        ``sglang:max_total_num_tokens``; vLLM's ``cache_config_info``
                                                       ``num_gpu_blocks`` x ``block_size``
=====================================================  =========================================================

Names as in vLLM's ``v1/metrics/loggers.py`` (``PrometheusStatLogger``) and SGLang's
``observability/metrics_collector.py``. A file that is not Prometheus text is one ``DsakvError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError


@dataclass
class MetricFacts:
    path: str
    ttft_sum_s: float = 0.0
    ttft_count: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    cache_hit_rate: float | None = None
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    pool_tokens: int | None = None
    families: int = 0

    @property
    def ttft_mean_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    @property
    def hit_rate(self) -> float | None:
        if self.prefix_queries:
            return self.prefix_hits / self.prefix_queries
        if self.prompt_tokens and self.cached_tokens:
            return self.cached_tokens / self.prompt_tokens
        return self.cache_hit_rate

    def to_dict(self) -> dict:
        return {
            "ttft_mean_s": self.ttft_mean_s,
            "ttft_count": self.ttft_count,
            "hit_rate": self.hit_rate,
            "pool_tokens": self.pool_tokens,
        }


_SUMS = {
    "time_to_first_token_seconds_sum": "ttft_sum_s",
    "time_to_first_token_seconds_count": "ttft_count",
    "prefix_cache_queries_total": "prefix_queries",
    "prefix_cache_hits_total": "prefix_hits",
    "prompt_tokens_total": "prompt_tokens",
    "cached_tokens_total": "cached_tokens",
}


def _take(facts: MetricFacts, name: str, labels: dict, value: float) -> None:
    engine, _, short = name.partition(":")
    if engine not in ("vllm", "sglang"):
        return
    if short in _SUMS:
        attr = _SUMS[short]
        setattr(facts, attr, getattr(facts, attr) + value)
    elif short == "cache_hit_rate":
        facts.cache_hit_rate = value
    elif short == "max_total_num_tokens":
        facts.pool_tokens = int(value)
    elif short == "cache_config_info" and labels.get("num_gpu_blocks", "").isdigit():
        facts.pool_tokens = int(labels["num_gpu_blocks"]) * int(labels.get("block_size", "0") or 0)


def read_metrics(path: str) -> MetricFacts:
    try:
        from prometheus_client.parser import text_fd_to_metric_families
    except ImportError:
        raise DsakvError("--metrics needs prometheus_client: pip install 'dsakv[metrics]'") from None

    facts = MetricFacts(path)
    try:
        with open(path, encoding="utf-8") as f:
            for family in text_fd_to_metric_families(f):
                facts.families += 1
                for s in family.samples:
                    _take(facts, s.name, s.labels, s.value)
    except OSError as exc:
        raise DsakvError(f"--metrics {path}: cannot read ({exc.strerror})") from None
    except (ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise DsakvError(f"--metrics {path}: not Prometheus text ({str(exc).splitlines()[0][:80]})") from None
    if not facts.families:
        raise DsakvError(f"--metrics {path}: no metric in it (a Prometheus text scrape of /metrics)")
    return facts


__all__ = ["MetricFacts", "read_metrics"]
