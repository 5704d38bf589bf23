"""``--sweep`` flags of ``dsakv simulate``: parsing ``KEY=V1,V2`` into overrides of ``SimConfig`` fields (or of its
nested ``GpuSetting``: ``dcp``, ``dp_attention``, ``gpu_memory_bytes``, ``max_batched_tokens`` ...) and the
columns of the comparison table. The sweep itself (worker processes, the ``what-if`` preset) is ``dsakv.sim.sweep``."""

from __future__ import annotations

import itertools

from dsakv.cli.gpu_args import parse_bytes, parse_int
from dsakv.errors import DsakvError, check_choice
from dsakv.planner.weights import MOE_A2A
from dsakv.sim.config import SimConfig
from dsakv.sim.sweep import SweepRow, what_if_points

_KEY_ALIASES = {
    "pool": "pool_tokens",
    "gpu_memory": "gpu_memory_bytes",
    "dtype": "kv_dtype",
    "insert": "insert_mode",
    "mode": "insert_mode",
    "policy": "eviction_policy",
    "indexer": "indexer_pattern",  # the old field names
    "mtp": "num_speculative_tokens",
}
_KEY_ALIASES |= {"max_batched_tokens": "max_batched_tokens", "dp": "dp_attention", "schedule": "schedule_policy"}
SWEEP_KEYS = ("eviction_policy", "pool_tokens", "gpu_memory_bytes", "indexer_pattern", "num_speculative_tokens", "dcp")
SWEEP_KEYS += ("kv_dtype", "insert_mode")
SWEEP_KEYS += ("preemption", "time_scale", "prefix_cache", "mem_fraction_static", "max_batched_tokens", "dp_attention")
SWEEP_KEYS += ("ep", "moe_a2a", "schedule_policy")
SWEEP_KEYS += ("instances", "router")
TABLE_COLUMNS = (
    ("pool_tokens", "pool tokens"),
    ("hit_rate_tokens", "hit rate (tokens)"),
    ("hit_rate_requests", "hit rate (requests)"),
    ("evicted_tokens", "evicted tokens"),
    ("preemptions", "preemptions"),
    ("rejected", "rejected"),
    ("indexer_flops_saved", "indexer FLOPs saved"),
    ("peak_pool_use", "peak pool use"),
    ("ttft_p50", "TTFT p50 (s)"),
    ("ttft_p99", "TTFT p99 (s)"),
    ("tpot_p50", "TPOT p50 (s)"),
    ("output_tokens_per_s", "output tok/s"),
    ("load_imbalance", "load imbalance"),
)


def _convert(key: str, text: str):
    if key in ("pool_tokens", "num_speculative_tokens", "dcp", "max_batched_tokens", "dp_attention", "ep", "instances"):
        return parse_int(f"--sweep {key}", text, 0 if key == "num_speculative_tokens" else 1)
    if key == "gpu_memory_bytes":
        return parse_bytes(f"--sweep {key}", text)
    if key in ("time_scale", "mem_fraction_static"):
        try:
            return float(text)
        except ValueError:
            raise DsakvError(f"--sweep {key} = {text!r}: must be a number") from None
    if key == "moe_a2a":  # a GpuSetting field: checked here, before any point runs, as a SimConfig value is
        check_choice("moe_a2a", text, MOE_A2A)
    if key == "prefix_cache":
        if text not in ("on", "off"):
            raise DsakvError(f"--sweep prefix_cache = {text!r}: must be on or off")
        return text == "on"
    return text


def parse_sweep(specs: list[str], base: SimConfig) -> list[dict]:
    """``["policy=lru,lfu", "num_speculative_tokens=0,1"]`` -> the Cartesian product as field overrides;
    ``what-if`` preset."""
    if specs == ["what-if"]:
        return what_if_points(base)
    dims = []
    for spec in specs:
        if spec == "what-if":
            raise DsakvError("--sweep what-if is a preset: give it alone")
        key, sep, values = spec.partition("=")
        key = _KEY_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in SWEEP_KEYS or not values:
            raise DsakvError(f"--sweep {spec!r}: must be KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        dims.append([(key, _convert(key, v.strip())) for v in values.split(",") if v.strip()])
    return [dict(combo) for combo in itertools.product(*dims)]


def row_figures(row: SweepRow) -> dict:
    """The comparison-table figures of one row (None where the point failed)."""
    s = row.summary
    if s is None:
        return {key: None for key, _ in TABLE_COLUMNS}
    flat = dict(s)
    flat["ttft_p50"], flat["ttft_p99"] = s["ttft_s"]["p50"], s["ttft_s"]["p99"]
    flat["tpot_p50"] = s["tpot_s"]["p50"]
    return {key: flat.get(key) for key, _ in TABLE_COLUMNS}
