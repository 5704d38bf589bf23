"""Replay published serving benchmarks through ``dsakv simulate`` and compare (docs/steptime-log.md, calibration).

    python bench/calibrate.py --anchors PATH/anchors.csv [--json] [--only ID,ID] [--set NAME=VALUE ...] [--jobs N]
    python bench/calibrate.py --anchors PATH/anchors.csv --fit [--json]
    python bench/calibrate.py --anchors PATH/anchors.csv --refine [--json]

Each CSV row is one benchmark (columns: ``../shared/data/calibration/README.md``; docs/calibration-data.md); its
workload is ``traces/<id>.jsonl`` beside the CSV or, when no such file is committed, the trace
``bench/calibration/make_traces.py`` writes from the row's n / isl / osl / rate. One output row per anchor and
published metric (``METRICS``: each named for what its sources count, e.g. ``total_tok_s`` = input + output tokens
per second, vLLM's "Total Token throughput" and gpustack's "Total TPS"): ``id``, ``metric``, ``published``,
``dsakv``, ``ratio`` (published / dsakv for times, dsakv / published for rates: above 1 = dsakv too fast) and
``band_ok`` (``BANDS``: TTFT, E2E and duration within 0.6-1.6x, TPOT and throughputs within 0.8-1.25x). A row that
cannot be replayed (weights larger than the GPU, a request that can never fit, nothing finished) is an error row,
``ERROR`` with the reason, never in band, and the run goes on. Then the geometric mean of each metric's ratios, the
per-family summary (engine x GPU x MTP on/off x DP on/off: rows, out of band, errors, geometric mean, worst), the
requests decoding at once where a row publishes a mean TPOT and an output throughput (``decoders``: Little's law,
published against the replay, not banded: it tells a step priced wrong from a pool or admission that ran a
different number of requests) and the worst row. Exit status 1 if any row is outside its band or an error row or a metric's geometric mean is outside 0.9-1.1 (``GEOMEAN_BAND``), 2 on a bad file (unknown metric, no
trace to replay, unknown ``--only`` id).

Replay: a burst is every request at t = 0 (the trace's timestamps); ``conc`` = C is a closed loop (request k
starts when request k - C finishes; TTFT from that moment). The scheduling policy follows the engine of the
row: an ``engine`` column if present, else ``prefill_first`` (SGLang) when the id or note names SGLang
(``sgl``), ``mixed`` (vLLM) otherwise. ``budget`` empty = ``chunk`` tokens per step. ``mem`` empty = the engine's
own default (``engine_mem_fraction``): SGLang's ``--mem-fraction-static`` heuristic, vLLM's
``--gpu-memory-utilization`` 0.9; ``kv`` empty = the engine's default cache format (``engine_kv_dtype``: bf16);
``cap`` empty = the engine's running-request cap (``engine_max_running``: vLLM 1024, SGLang 4096, 48 with MTP).
A cell is filled only where the row's source's launch command names the setting (the gpustack rows leave ``mem``
and ``kv`` empty: their commands set neither). ``--set NAME=VALUE`` (repeatable) replays with one of the roofline's numeric fields
(``SETTABLE``: efficiencies, floors, overheads) or ``frontend_s`` set, for experiments that docs/steptime.md reports
without changing the defaults.

Rows of a model without the lightning indexer (an ``indexer`` column 0, or an ``r1-*`` id: DeepSeek-R1 on the
DSA preset) are priced with ``RooflineStepTime(has_indexer=False)``.

Every figure is the client's: each request reaches the engine ``FRONTEND_S`` after the client sends it (fitted,
docs/steptime.md). Lengths follow the row's benchmark client: a ``range_ratio`` column r draws each request's
input and output lengths uniformly from [r x len, len] (seeded); without it, rows from InferenceX take its
client's ``INFERENCEX_RANGE_RATIO`` and the others keep the trace's lengths.

``--fit`` replays every row at every point of ``FIT_GRID`` (the free parameters) and prints the
points best first: fewest rows outside their band (the issue's criterion), then the smallest loss (sum over
rows and metrics of log(ratio)^2); the best point's table follows.
``--refine`` starts from the defaults and moves one free parameter at a time (``REFINE_BOUNDS``, multiplying or
dividing by a step factor that shrinks over four rounds) while (rows out of band, loss) improves; the refined
point's table follows.
``--jobs N`` replays the rows in N forked processes on Linux (0: one per CPU; one process elsewhere); each replay is
independent and seeded, so the table is the same at any N.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import functools
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import random
import re
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dsakv.errors import DsakvError
from dsakv.planner.budget import pool_capacity
from dsakv.planner.deployment import DEFAULT_ACTIVATION_BYTES, GpuSetting, RankMemory
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.weights import weight_parts
from dsakv.sim import run
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.source import Source, open_source
from dsakv.sim.steptime import MOE_A2A, RooflineStepTime
from dsakv.sim.steptime.fitted import NCCL_NVLINK_BUS_EFF
from dsakv.sim.steptime.kernels import GEMM_STREAM_EFF
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec
from dsakv.workloads.traces import TraceRequest

# The bands of the step-time issue's "done when": TTFT, E2E latency and duration within 0.6-1.6, TPOT and every
# throughput within 0.8-1.25.
BANDS = {"ttft_ms": (0.6, 1.6), "e2e_ms": (0.6, 1.6), "e2e_per_token_ms": (0.6, 1.6), "duration_s": (0.6, 1.6)}
DEFAULT_BAND = (0.8, 1.25)
# Every metric's geometric mean over the rows must lie in this band too (issue 25: "geometric means within 0.9-1.1").
GEOMEAN_BAND = (0.9, 1.1)
# A grid over the free parameters that --fit searches: the step time's two fitted efficiencies
# (``dsakv.sim.steptime.fitted``; every other term is derived, docs/steptime.md, Constants) and ``frontend_s`` (the
# SimConfig's front-end latency, client send -> scheduler queue: the replay's one fitted time). --refine moves the
# same parameters from the defaults instead.
FIT_GRID = {
    "bw_eff": (0.5, 0.56, 0.62),
    "link_eff": (0.25, 0.35, 0.5),
    "frontend_s": (0.2, 0.25, 0.3),
}
# Bounds of the free parameters that --refine moves (coordinate descent on log scale): each efficiency up to its
# published bound (bw_eff: DeepGEMM's streaming 0.836, link_eff: NCCL's 0.82 bus bandwidth), the front-end latency
# within a factor 2.5 of its value.
REFINE_BOUNDS = {
    "bw_eff": (0.3, GEMM_STREAM_EFF),
    "link_eff": (0.1, NCCL_NVLINK_BUS_EFF),
    "frontend_s": (0.1, 0.6),
}
# The roofline's numeric fields --set may override (its efficiencies, floors and overheads; not mtp_accept, which the
# row's `accept` column sets for the scheduler too), and the front-end latency.
SETTABLE = (
    *(f.name for f in dataclasses.fields(RooflineStepTime) if f.type in ("float", "float | None") and f.init),
    "frontend_s",
)
# Front-end latency of every replayed request (SimConfig.frontend_s): fitted on anchors.csv, the least loss on a line
# search (2026-12-07, twelfth sitting, once SGLang rows replay the overlap scheduler's step of lag,
# ``engine_overlap_schedule``: 0.17 / 0.19 / 0.195 / 0.20 / 0.21 s give 0.388 / 0.368 / 0.365 / 0.366 / 0.370; 0.22
# before it; docs/steptime-log.md). Not SGLang's own front-end, which its concurrency-1 TTFTs bound at about 29 ms
# (sgl-project/sglang#13466: 95.2 ms for a 1,024-token prompt dsakv prefills in 66.0 ms): the anchors' InferenceX rows
# spend it outside the engine's steps, since a prefill long enough to hold it would stall their decodes
# (docs/steptime.md, Known gaps).
FRONTEND_S = 0.20
# One serving front-end's time per request before the engine starts it (docs/steptime.md, fact 18): vLLM 0.19's API
# server, one request at a time (concurrency 1), (prompt tokens, seconds from the client's send to the first byte
# back, before the prefill: HTTP parsing, tokenization, scheduling, "HTTP OH"); MiniMax-M2.5 FP8 on 2 x MI300X,
# andyluo7/cpu-gpu-codesign-agentic-inference RESULTS_SUMMARY.md (2026-05-14), its four single-request rows. Both
# engines of the anchors ran one such process (vLLM --api-server-count 1 at DP 1, SGLang --tokenizer-worker-num 1).
FRONTEND_MEASURED = ((1_000, 0.007), (8_000, 0.015), (32_000, 0.047), (100_000, 0.131))
# InferenceX's benchmark client draws every request's input and output lengths uniformly from [0.8 x len, len]
# (RANDOM_RANGE_RATIO 0.8 in its "Benchmark Client Configuration", passed to benchmark_serving.py's random
# dataset with --ignore-eos; benchmarks/benchmark_lib.sh run_benchmark_serving --random-range-ratio).
INFERENCEX_RANGE_RATIO = 0.8


@dataclass(frozen=True)
class Row:
    """One published figure against the replay; an error row (``error`` set) is an anchor that could not be replayed
    (its ``dsakv`` and ``ratio`` are NaN and it is never in band)."""

    id: str
    metric: str
    published: float
    dsakv: float
    ratio: float
    band_ok: bool
    family: str = ""
    error: str | None = None

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("id", "metric", "published", "dsakv", "ratio", "band_ok", "family")}
        if self.error is not None:
            out.update(dsakv=None, ratio=None, error=self.error)
        return out


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return default if text == "" else int(float(text))


def policy_of(anchor: dict) -> str:
    engine = (anchor.get("engine") or "").strip().lower()
    if engine:
        return "prefill_first" if engine.startswith("sgl") else "mixed"
    text = f"{anchor['id']} {anchor.get('note', '')}".lower()
    return "prefill_first" if "sgl" in text else "mixed"


VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
# vLLM sizes its KV cache from the peak of a profiling forward, and for a DSA model that forward reserves the shared
# workspace of the sparse prefill at its largest (``current_workspace_manager().get_simultaneous``; a shared buffer,
# so the larger request sizes it): the indexer's gathered keys, ``get_max_prefill_buffer_size`` = 40 x max_model_len
# rows of one indexer K row each (128 fp8 bytes + a 4-byte scale: ``vllm/v1/attention/backends/mla/indexer.py``,
# reserved by ``sparse_attn_indexer``'s profiling branch), sized there to fit FlashMLA-sparse's fp8-cache prefill
# workspace of 5 x max_model_len bf16 latent rows ("(576 * 2 // 132) * 5 = 40"), which an fp8 cache reserves in the
# same buffer (``FlashMLASparseImpl.__init__``). The 40 is there since the fp8 sparse prefill
# (vllm-project/vllm#27532, 2025-11) and quoted at 40 in April 2026 (#41002); #55221 measures the reservation with
# ``VLLM_DEBUG_WORKSPACE=1``: 5,036 MB at ``--max-model-len`` 1,000,000 (``engine_workspace_bytes``).
VLLM_INDEXER_PREFILL_ROWS = 40
VLLM_SPARSE_PREFILL_ROWS = 5


# vLLM V1 reserves nothing for future output: its scheduler allocates KV blocks for the tokens it schedules this step
# (KVCacheManager.allocate_slots(request, num_new_tokens)) and preempts when none are left.
VLLM_NEW_TOKEN_RATIO = 0.0
# SGLang's scheduler starts its new-token ratio at min(SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness, 1)
# (sglang/srt/managers/scheduler.py, env SGLANG_INIT_NEW_TOKEN_RATIO); ServerArgs._handle_data_parallelism multiplies
# schedule_conservativeness (1.0) by SGLANG_DP_ATTENTION_CONSERVATIVENESS under --enable-dp-attention.
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_DP_ATTENTION_CONSERVATIVENESS = 0.3
# SGLang's NewTokenRatioTracker (scheduler_components/new_token_ratio_tracker.py; environ.py): the ratio decays to
# init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR over SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS decode steps, there since 2024.
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
# SGLang counts at most this much of a request's remaining output before the ratio, in a running request's reserve
# and a new one's admission check (schedule_policy.py CLIP_MAX_NEW_TOKENS, env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION,
# default 4096 since 2024; PrefillAdder._get_running_request_total_token_offset and add_one_req).
SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096
# Who a full pool preempts and where it waits again, (victim_order, requeue): vLLM V1 preempts the last of its
# running list (``self.running.pop()``, the newest) and puts it at the front of the waiting queue
# (``prepend_request``); SGLang retracts the fewest outputs first, then the longest prompt
# (``ScheduleBatch.retract_decode``). SGLang appends the retracted request to its waiting queue, which its default
# fcfs policy leaves in order (``Scheduler._add_request_to_queue``, ``SchedulePolicy.calc_priority``); the replay
# keeps ``front`` for SGLang too: dsakv's preemption is not SGLang's retraction yet (one page on demand, the victim's
# pages cached, where SGLang frees room for 20 decode steps and caches nothing), and with ``back`` the check file
# loses a figure (docs/steptime-log.md, "Admission").
VLLM_PREEMPTION = ("newest", "front")
SGLANG_RETRACTION = ("fewest_outputs", "front")


def sglang_chunked_prefill_size(gpu_memory_mib: float) -> int:
    """SGLang's default ``--chunked-prefill-size`` by GPU memory (``ServerArgs._handle_gpu_memory_settings``): 8192
    below 160 GiB (H100, H20, H200), 16384 above (B200, MI300X). A global budget: under DP attention
    ``_handle_data_parallelism`` divides it by the DP size, so each DP rank's scheduler chunks by 1/dp of it."""
    return 8192 if gpu_memory_mib < 160 * 1024 else 16384


# What SGLang's memory heuristic reserves for an MLA model's piecewise prefill graphs (``reserve_for_graph_mb``: "MLA
# backend overhead is much higher than expected with fa3"), since they became the default (c64274c74).
SGLANG_MLA_PREFILL_GRAPH_RESERVE_MIB = 1.5 * 1024


def sglang_mem_fraction_static(
    gpu_memory_mib: float, tp: int, dp_attention: int, draft_reserve_mib: float, prefill_graph: bool = False
) -> float:
    """SGLang's default ``--mem-fraction-static`` (``ServerArgs._handle_gpu_memory_settings``, SGLang >= 0.5):
    reserve, in MiB, 512 + 1.5 x max(chunked prefill, 2048) + 2 x cuda-graph max batch + tp/8 x 1024, with DP
    attention + 3 x (4.5 x above a 300 max batch) x cuda-graph max batch x dp, with piecewise prefill graphs of an
    MLA model + ``SGLANG_MLA_PREFILL_GRAPH_RESERVE_MIB``, at least 10 GiB above 60 GiB, + ``draft_reserve_mib`` for an
    EAGLE draft model (``sglang_eagle_reserve_mib``: 0 without one). Chunked prefill
    (``sglang_chunked_prefill_size``, before the DP division) / cuda-graph max batch by memory: 8192 / 512 (TP >= 4) below 160 GiB (H100, H200), 16384 / 512 above (B200,
    MI300X)."""
    chunk = sglang_chunked_prefill_size(gpu_memory_mib)
    graph_bs = 512 if tp >= 4 or gpu_memory_mib >= 160 * 1024 else 256
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if dp_attention > 1:
        reserved += graph_bs * dp_attention * (4.5 if graph_bs > 300 else 3)
    if prefill_graph:
        reserved += SGLANG_MLA_PREFILL_GRAPH_RESERVE_MIB
    if gpu_memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    reserved += draft_reserve_mib
    return round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)


# What SGLang's ``--mem-fraction-static`` heuristic reserves for an EAGLE / MTP draft model and its CUDA graphs, by
# build (``ServerArgs._handle_gpu_memory_settings``), (from, MiB): 2 GiB since the heuristic's rewrite
# (sgl-project/sglang#7054, 6b12d6a8d), 4 GiB from e55e65535 (#19418, 2026-02-26), nothing from 75998d042 (#23862,
# 2026-06-12: "Fix --mem-fraction-static not accounting for EAGLE draft model KV cache", the draft's weights are
# loaded before the memory profile and its pool is sized inside the same fraction, as dsakv's layout already counts
# the MTP layer's pages, ``CacheLayout.mtp_layers``).
SGLANG_EAGLE_RESERVE_MIB = (
    (datetime.date(2025, 6, 10), 2 * 1024),
    (datetime.date(2026, 2, 26), 4 * 1024),
    (datetime.date(2026, 6, 12), 0),
)


def sglang_eagle_reserve_mib(anchor: dict) -> int:
    """The draft model's share of SGLang's reserve for the row's build (``SGLANG_EAGLE_RESERVE_MIB``); 0 for a row
    without speculative decoding. A build is placed by its bounds: the day it was in use (``sglang_build_date``, or the
    first entry's value for an empty ``version``) before a change, or its earliest cut (``sglang_cut_no_earlier``) on
    or after one; a build whose bounds straddle a change is an error asking for the row's ``mem``."""
    if not (_int(anchor.get("mtp"), 0) or 0):
        return 0
    built, cut = sglang_build_date(anchor), sglang_cut_no_earlier(anchor)
    era = SGLANG_EAGLE_RESERVE_MIB[0][1]
    for since, mib in SGLANG_EAGLE_RESERVE_MIB[1:]:
        if built is None or built < since:
            return era
        if cut is None or cut < since:
            raise DsakvError(
                f"anchor {anchor['id']}: version = {anchor.get('version')!r}: its build may predate SGLang's EAGLE "
                f"memory reserve change of {since} (SGLANG_EAGLE_RESERVE_MIB) or not; set the row's mem"
            )
        era = mib
    return era


def engine_new_token_ratio(anchor: dict) -> float:
    """The admission's reserve for running requests' remaining output, as the row's engine starts it: SGLang's
    ``init_new_token_ratio`` (0.7 x schedule_conservativeness, which DP attention scales by 0.3: 0.21); none for
    vLLM rows (``VLLM_NEW_TOKEN_RATIO``)."""
    if policy_of(anchor) == "mixed":
        return VLLM_NEW_TOKEN_RATIO
    conservativeness = SGLANG_DP_ATTENTION_CONSERVATIVENESS if _int(anchor.get("dp"), 1) > 1 else 1.0
    return min(SGLANG_INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)


def engine_new_token_ratio_min(anchor: dict) -> float | None:
    """The floor SGLang's tracker decays the ratio to (``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` x its start); None for
    vLLM rows (nothing reserved, nothing to decay)."""
    if policy_of(anchor) == "mixed":
        return None
    return min(engine_new_token_ratio(anchor) * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)


def engine_new_token_clip(anchor: dict) -> int | None:
    """The most remaining output the admission's reserve counts: SGLang's ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``;
    none for vLLM rows (they reserve nothing ahead)."""
    return None if policy_of(anchor) == "mixed" else SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


def engine_preemption(anchor: dict) -> tuple[str, str]:
    """The row's engine's (victim_order, requeue): ``VLLM_PREEMPTION`` or ``SGLANG_RETRACTION``."""
    return VLLM_PREEMPTION if policy_of(anchor) == "mixed" else SGLANG_RETRACTION


def engine_chunk_tokens(anchor: dict) -> int:
    """The chunked-prefill size each DP group's scheduler uses: the row's ``chunk`` (a per-rank value: the DP8 rows'
    1,024 is what SGLang's H200 default 8,192 becomes per rank under DP attention), else the engine's default,
    SGLang's divided by the DP size as ``_handle_data_parallelism`` does, 8,192 for vLLM."""
    chunk = _int(anchor.get("chunk"))
    if chunk is not None:
        return chunk
    if policy_of(anchor) == "mixed":
        return 8192
    return sglang_chunked_prefill_size(gpu_kind(anchor["gpu"]).memory_bytes / 2**20) // _int(anchor.get("dp"), 1)


def engine_workspace_bytes(anchor: dict) -> int:
    """What the row's engine holds outside its pool beyond the planner's activation reserve: for vLLM serving a model
    with the lightning indexer, the sparse prefill's workspace its memory profile reserves
    (``VLLM_INDEXER_PREFILL_ROWS`` indexer rows per token of max_model_len, or ``VLLM_SPARSE_PREFILL_ROWS`` bf16 latent
    rows with an fp8 cache where that is larger), max_model_len being the model's ``max_position_embeddings`` (no
    row on file sets ``--max-model-len``); 0 otherwise."""
    if policy_of(anchor) != "mixed" or not has_indexer(anchor):
        return 0
    spec = load_spec(anchor["model"], None)
    kv = engine_kv_dtype(anchor)
    context = spec.max_position_embeddings
    workspace = VLLM_INDEXER_PREFILL_ROWS * context * CacheLayout(spec, kv_dtype=kv).indexer_row_bytes
    if kv != "bf16":
        latent_bf16 = (spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
        workspace = max(workspace, VLLM_SPARSE_PREFILL_ROWS * context * latent_bf16)
    return workspace


def engine_mem_fraction(anchor: dict) -> float:
    """The row's ``mem`` or, when empty, its engine's default memory fraction."""
    if (anchor.get("mem") or "").strip():
        return float(anchor["mem"])
    if policy_of(anchor) == "mixed":
        return VLLM_GPU_MEMORY_UTILIZATION
    gpus, dp = _int(anchor["gpus"]), _int(anchor.get("dp"), 1)
    return sglang_mem_fraction_static(
        gpu_kind(anchor["gpu"]).memory_bytes / 2**20,
        gpus,
        dp,
        sglang_eagle_reserve_mib(anchor),
        prefill_graph=engine_prefill_graph(anchor),
    )


# vLLM's --max-num-seqs default on a GPU of >= 70 GiB under the API server (EngineArgs._set_default_args: 1024; 256
# on smaller GPUs). SGLang without --max-running-requests takes its request pool's size, clamped to [2048, 4096]
# (ModelRunner: max(min(pool tokens / context length x 512, 4096), 2048)): SGLANG_MAX_RUNNING, the clamp's top, is
# the same bound as any value of the range for every row of concurrency <= 2048. Speculative decoding resets it to
# SGLANG_SPEC_MAX_RUNNING (ServerArgs: "Max running requests is reset to 48 for speculative decoding").
VLLM_MAX_NUM_SEQS = (1024, 256)
SGLANG_MAX_RUNNING = 4096
SGLANG_SPEC_MAX_RUNNING = 48


def engine_max_running(anchor: dict) -> int:
    """The cap on running requests of each DP group's scheduler (``SimConfig.max_running``): the row's ``cap`` (the
    engine's flag as the source passes it) or, when empty, its engine's default. SGLang's ``--max-running-requests``
    (and the 48 that speculative decoding resets it to) counts the whole server: each DP worker takes
    ``max_running_requests // dp_size`` (``ModelRunner._resolve_max_num_reqs``); without either, each worker takes its
    pool's clamp (``SGLANG_MAX_RUNNING``)."""
    cap = _int(anchor.get("cap"))
    if policy_of(anchor) == "mixed":
        if cap is not None:
            return cap
        big, small = VLLM_MAX_NUM_SEQS
        return big if gpu_kind(anchor["gpu"]).memory_bytes >= 70 * 2**30 else small
    if cap is None and (_int(anchor.get("mtp"), 0) or 0) > 0:
        cap = SGLANG_SPEC_MAX_RUNNING
    if cap is None:
        return SGLANG_MAX_RUNNING
    return max(cap // _int(anchor.get("dp"), 1), 1)


# When SGLang builds on file were cut, for the engine defaults that changed between them (each found in SGLang's
# history: the commit's date, or the day the install docs first named the release). A release is dated no later
# than it was in use: v0.5.9 by the install page's switch to it (1b76eb936, 2026-03-04), v0.5.14 by its ROCm image
# (lmsysorg/sglang-rocm:v0.5.14-rocm720-mi35x-20260710; the docs moved on to v0.5.15 on 2026-07-13, 805385414),
# v0.5.13.post1 by the first page to name it (7bd1a9d16, 2026-06-15; its ROCm image is tagged 20260618).
SGLANG_RELEASE_DATES = {
    "0.5.6": datetime.date(2025, 12, 2),  # 7ae368efd "bump SGLang version to 0.5.6"
    "0.5.6.post1": datetime.date(2025, 12, 9),  # 9a327bdfc
    "0.5.6.post2": datetime.date(2025, 12, 11),  # 5c8bd8b51
    # no later than in use: InferenceX moved its DeepSeek-R1 H200 configuration to ``lmsysorg/sglang:v0.5.7-cu129-amd64``
    # on 2026-01-22 (6e35460d2, its #538); the held-out v0.5.7 update rows run it
    "0.5.7": datetime.date(2026, 1, 22),
    "0.5.9": datetime.date(2026, 3, 4),
    # no later than in use: the docs' image table of a3291b565 (2026-04-20) names ``lmsysorg/sglang:v0.5.10.post1``
    # (after 0.5.9; only the fit file's DeepSeek-V3 rows run it, and no rule here turns on a date in between)
    "0.5.10.post1": datetime.date(2026, 4, 20),
    # no later than in use: InferenceX moved its DeepSeek-R1 B300 configuration to ``lmsysorg/sglang:v0.5.12-cu130``
    # on 2026-05-16 (506258aea, its #1419; v0.5.11 was in use there from 2026-05-12); the held-out R1 rows run it
    "0.5.12": datetime.date(2026, 5, 16),
    "0.5.13.post1": datetime.date(2026, 6, 15),
    "0.5.14": datetime.date(2026, 7, 10),
}
# A release's earliest possible cut, where a source bounds it: v0.5.12's release branch took a DeepSeek-V4 fix
# (sgl-project/sglang#26071, "[Cherry-pick to release/v0.5.12] perf(dsv4): add MHC token-count prewarm (#25810)"), and
# the DeepSeek-V4 model first landed on main on 2026-05-07 (35870d55a, #23882, ``models/deepseek_v4.py``).
SGLANG_RELEASE_CUT_AFTER = {"0.5.12": datetime.date(2026, 5, 7)}
SGLANG_COMMIT_DATES = {
    "947927bdb": datetime.date(2026, 2, 11),  # the GLM-5 cookbook's commit
    "1eea7448": datetime.date(2026, 3, 17),
    "b6fe0cca": datetime.date(2026, 3, 31),
    "09ca4fc": datetime.date(2026, 6, 26),  # the GLM-5.2 cookbook's B200 cells ("main @ 09ca4fc")
}
# Model-launch images, by the date of the page that named them: the GLM-5 cookbook (sgl-project/sgl-cookbook b7feb18,
# 2026-02-11) installs GLM-5 on Hopper from ``lmsysorg/sglang:glm5-hopper`` and on Blackwell from
# ``lmsysorg/sglang:glm5-blackwell``, and benchmarks "SGLang Version: commit 947927bdb"; its page of 2026-03-24
# (6e1b81d) drops both images for main. No Hopper default below changes between those dates; the Blackwell cache
# default does (2026-03-07, 2026-03-24), but the held-out GLM-5 B200 rows that run the Blackwell image are dated
# 2026-02-13 (their report), before either change.
SGLANG_IMAGE_DATES = {"glm5-hopper": datetime.date(2026, 2, 11), "glm5-blackwell": datetime.date(2026, 2, 11)}
# The defaults that changed: SGLang ran EAGLE / MTP without its overlap scheduler until spec v2 became its default
# on SGLANG_SPEC_V2_DATE (sgl-project/sglang#21062, 79dbfe450; ``ServerArgs._handle_speculative_decoding`` before it:
# "Overlap scheduler is disabled when spec v2 is off"): the GLM-5 cookbook's commit 947927bdb (2026-02-11) predates
# it, the GLM-5.2 cookbook's builds (v0.5.14, main @ 09ca4fc) follow it. A DSA model's default cache on Blackwell (SM >= 10, ``ServerArgs``' DSA defaults when
# ``--kv-cache-dtype`` is ``auto``), (since, format without DP attention, format with it): fp8_e4m3 with FlashMLA's
# 656-byte rows from sgl-project/sglang#11655 (81a632ace), fp8 only under DP attention from #20086 (d28f35240),
# bf16 everywhere for fp8 checkpoints from #21337 (2b75fed0d, "performance regression" on B200), then fp8_e4m3 on
# TensorRT-LLM's sparse-MLA kernels, whose rows are the plain 576 fp8 bytes (``calculate_mla_kv_cache_dim``: the
# trtllm backend keeps kv_lora_rank + rope dims), from #21914 (fbc1f9245). Hopper keeps bf16 throughout.
SGLANG_SPEC_V2_DATE = datetime.date(2026, 4, 29)
SGLANG_BLACKWELL_DSA_KV = (
    (datetime.date(2025, 10, 27), "fp8_ds_mla", "fp8_ds_mla"),
    (datetime.date(2026, 3, 7), "bf16", "fp8_ds_mla"),
    (datetime.date(2026, 3, 24), "bf16", "bf16"),
    (datetime.date(2026, 4, 2), "fp8", "fp8"),
)


def _release_of(version: str) -> str | None:
    """The release of ``SGLANG_RELEASE_DATES`` a ``version`` names (``0.5.9``, ``v0.5.14``, an image
    ``lmsysorg/sglang:v0.5.9-cu130``), or None."""
    release = re.match(r"^(?:[\w./-]+:)?v?(\d+\.\d+\.\d+(?:\.post\d+)?)(?:[-\s]|$)", version)
    return release.group(1) if release and release.group(1) in SGLANG_RELEASE_DATES else None


def sglang_build_date(anchor: dict) -> datetime.date | None:
    """When the row's SGLang build was cut (``version``): a release (``0.5.9``, ``v0.5.14``, an image
    ``lmsysorg/sglang:v0.5.9-cu130``) from ``SGLANG_RELEASE_DATES``, a commit (``commit 947927bdb``,
    ``main @ 09ca4fc``) from ``SGLANG_COMMIT_DATES``, a model-launch image (``lmsysorg/sglang:glm5-hopper``) from
    ``SGLANG_IMAGE_DATES``, a nightly image by the date in its tag; None for an empty
    ``version`` (the row is replayed with the defaults before every change tracked here: every such row on file
    predates them). A version that is none of these is an error naming the tables."""
    text = (anchor.get("version") or "").strip()
    if not text:
        return None
    nightly = re.search(r"nightly[-\w]*?-(\d{8})(?:-|$)", text)
    if nightly:
        return datetime.datetime.strptime(nightly.group(1), "%Y%m%d").date()
    release = _release_of(text)
    if release:
        return SGLANG_RELEASE_DATES[release]
    for commit, date in SGLANG_COMMIT_DATES.items():
        if re.search(rf"\b{commit}", text):
            return date
    image = re.match(r"^[\w./-]+:([\w.-]+)$", text)
    if image and image.group(1) in SGLANG_IMAGE_DATES:
        return SGLANG_IMAGE_DATES[image.group(1)]
    raise DsakvError(
        f"anchor {anchor['id']}: version = {text!r}: no build date on file; must name a release of "
        f"SGLANG_RELEASE_DATES ({', '.join(SGLANG_RELEASE_DATES)}), a commit of SGLANG_COMMIT_DATES "
        f"({', '.join(SGLANG_COMMIT_DATES)}), an image of SGLANG_IMAGE_DATES ({', '.join(SGLANG_IMAGE_DATES)}) "
        "or a nightly image with its date"
    )


def engine_spec_overlap(anchor: dict) -> bool:
    """Whether the row's engine overlaps its host work on speculative steps (``SimConfig.spec_overlap``): vLLM's
    async scheduling does; SGLang's EAGLE V1 does not: the default of an SGLang build before
    ``SGLANG_SPEC_V2_DATE`` (or of no version named), spec v2 after it."""
    if policy_of(anchor) == "mixed" or not (_int(anchor.get("mtp"), 0) or 0):
        return True
    built = sglang_build_date(anchor)
    return built is not None and built >= SGLANG_SPEC_V2_DATE


# vLLM's first release with async scheduling on by default (vllm-project/vllm#27614; v0.14.0's release notes: "Async
# scheduling is now enabled by default", except pipeline parallelism, the CPU backend and speculative decoding other
# than MTP / EAGLE, which #31998 brought in). Its ``EngineCore.step_with_batch_queue`` then keeps two batches in
# flight: a request that arrives while batch N runs is read after N's result and scheduled into N + 2, as SGLang's
# overlap loop does (docs/steptime.md fact 46). v0.13.0 and earlier ran the synchronous ``step``.
VLLM_ASYNC_SCHEDULING_SINCE = (0, 14, 0)


def vllm_release(anchor: dict) -> tuple[int, int, int] | None:
    """The row's vLLM release (``v0.18.0`` -> (0, 18, 0)); None for no version or a nightly wheel (the one on file,
    the DeepSeek-V3.2 recipe's install of 2025-12-04, vllm-project/recipes 008786cb, predates v0.14.0)."""
    release = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", (anchor.get("version") or "").strip())
    return None if release is None else tuple(int(part) for part in release.groups())


def engine_overlap_schedule(anchor: dict) -> bool:
    """Whether the row's engine plans each step while the one before it runs (``SimConfig.overlap_schedule``):
    SGLang's overlap scheduler does, unless EAGLE V1 turns it off (``engine_spec_overlap``; ``Scheduler.
    event_loop_overlap``, ``ServerArgs._handle_speculative_decoding``); vLLM's async scheduling does from
    ``VLLM_ASYNC_SCHEDULING_SINCE``."""
    if policy_of(anchor) == "prefill_first":
        return engine_spec_overlap(anchor)
    release = vllm_release(anchor)
    return release is not None and release >= VLLM_ASYNC_SCHEDULING_SINCE


def engine_recv_interval(anchor: dict) -> int:
    """The row's ``recv_interval`` column: SGLang's ``--scheduler-recv-interval`` as the source's command passes it
    (``SimConfig.scheduler_recv_interval``; empty: 1, the engine's default, receiving every loop turn). A value on a
    row of another engine, or other than a positive integer, is an error naming the row."""
    text = (anchor.get("recv_interval") or "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise DsakvError(f"anchor {anchor['id']}: recv_interval = {text}: must be a positive integer or empty (1)")
    if policy_of(anchor) != "prefill_first":
        raise DsakvError(
            f"anchor {anchor['id']}: recv_interval = {text}: SGLang's --scheduler-recv-interval; leave it empty "
            "on another engine's row"
        )
    return int(text)


def engine_mixed_chunk(anchor: dict) -> bool:
    """The row's ``mixed_chunk`` column: ``1`` where the source's deployment runs SGLang with ``--enable-mixed-chunk``
    (``SimConfig.mixed_chunk``: a prefill step carries the running decodes); empty or ``0``: off, SGLang's default.
    On another engine's row, or with speculative decoding (which SGLang turns it off for), it is an error naming the
    row."""
    text = (anchor.get("mixed_chunk") or "").strip()
    if text not in ("", "0", "1"):
        raise DsakvError(f"anchor {anchor['id']}: mixed_chunk = {text}: must be 1, 0 or empty (off)")
    if text != "1":
        return False
    if policy_of(anchor) != "prefill_first" or (_int(anchor.get("mtp"), 0) or 0) > 0:
        raise DsakvError(
            f"anchor {anchor['id']}: mixed_chunk = 1: SGLang's --enable-mixed-chunk, which it runs only without "
            "speculative decoding; leave it empty on this row"
        )
    return True


def engine_step_tokens(anchor: dict, chunk: int) -> int:
    """The prompt tokens one step may carry (``GpuSetting.max_batched_tokens``): the row's ``budget``
    (``--max-prefill-tokens`` / ``--max-num-batched-tokens``), else ``chunk``. SGLang's ``PrefillAdder`` counts a
    batch's prompt tokens against both ``--max-prefill-tokens`` and ``--chunked-prefill-size`` (``rem_input_tokens``,
    ``rem_chunk_tokens``), so an SGLang row takes the smaller."""
    budget = _int(anchor.get("budget"), chunk)
    return min(budget, chunk) if policy_of(anchor) == "prefill_first" else budget


# SGLang's piecewise prefill graphs (default since c64274c74, 2026-03-02) listed DeepseekV32ForCausalLM and
# GlmMoeDsaForCausalLM in ``piecewise_cuda_graph_disabled_model_archs`` until sgl-project/sglang#23351 ("Support
# piecewise CUDA graph with NSA", cadfa2d02) took them off; ``ServerArgs._disable_tc_piecewise_cudagraph_if_incompatible``
# still turns them off under DP attention and with an all-to-all MoE backend, and on every non-CUDA GPU, ROCm's HIP
# included: rule 6 of the default's own commit ("Non-CUDA hardware (AMD, NPU, etc.)"), the same rule at f7632ef86
# (2026-06-18, the MI355X cells' image date) and at 06ad7b2b0 ("non-CUDA hardware (HIP/NPU/CPU/MPS/XPU)").
SGLANG_DSA_PREFILL_GRAPH_DATE = datetime.date(2026, 5, 22)
SGLANG_PIECEWISE_GRAPH_DATE = datetime.date(2026, 3, 2)  # c64274c74, "Piecewise Cuda Graph set default" (#16331)
# SGLang built the lightning indexer on every layer of a DSA model, also on the layers that reuse the previous
# layer's top-k (GLM-5.2's IndexCache, 57 of 78), until sgl-project/sglang#30531 (8cc112d48, "[DSA] Skip indexer KV
# cache for skip-topk layers"): ``DeepseekV2AttentionMLA.__init__`` constructed ``Indexer(...)`` (replicated
# ``wq_b`` / ``wk`` / ``weights_proj`` / ``k_norm``) whenever the model uses DSA, and the pool gave each layer an
# indexer cache (``get_num_indexer_layers``: "DSA models (V3.2) instantiate an Indexer on every transformer layer").
# From it on, only the full layers and the MTP layer build either (``engine_pool_tokens``).
SGLANG_SKIP_TOPK_INDEXER_DATE = datetime.date(2026, 8, 17)


def _release_key(release: str) -> tuple[int, ...]:
    """``0.5.13.post1`` as (0, 5, 13, 1), ``0.5.12`` as (0, 5, 12, 0): the order SGLang cut its releases in."""
    numbers = re.findall(r"\d+", release)
    return tuple(int(n) for n in numbers) + (0,) * (4 - len(numbers))


def sglang_cut_no_earlier(anchor: dict) -> datetime.date | None:
    """The earliest day the row's SGLang build can have been cut: a commit's, a nightly's or a model-launch image's
    own date; for a release, the latest lower bound ``SGLANG_RELEASE_CUT_AFTER`` gives it or any release before it
    (releases are cut in version order), None where none is on file (the dates of ``SGLANG_RELEASE_DATES`` are
    upper bounds, the day a release was in use); None for an empty ``version``."""
    release = _release_of((anchor.get("version") or "").strip())
    if release:
        key = _release_key(release)
        bounds = [day for name, day in SGLANG_RELEASE_CUT_AFTER.items() if _release_key(name) <= key]
        return max(bounds, default=None)
    return sglang_build_date(anchor)


def engine_prefill_graph(anchor: dict) -> bool:
    """Whether the row's engine replays CUDA graphs for prefill steps (``SimConfig.prefill_graph``): vLLM V1's
    piecewise graphs do; SGLang's do by default since ``SGLANG_PIECEWISE_GRAPH_DATE``, except under DP attention, with
    an all-to-all MoE backend and on an AMD GPU (a CDNA kind: ROCm's HIP), and for a DSA model until
    ``SGLANG_DSA_PREFILL_GRAPH_DATE``. A dense-MLA row (DeepSeek-R1 / V3) replays them where its build was cut on or
    after the default (``sglang_cut_no_earlier``: InferenceX's v0.5.12 rows); the fit file's 0.5.9 and 0.5.10.post1
    rows cannot be placed against it and stay eager, as do the anchors' and v0.5.7 rows that predate it. (A
    piecewise graph covers prefill steps of up to 2,048 tokens for an MLA model; above that SGLang runs eagerly, where
    the eager floor no longer binds.)"""
    if policy_of(anchor) == "mixed":
        return True
    if _int(anchor.get("dp"), 1) > 1 or engine_moe_a2a(anchor)[0] != "none":
        return False
    if gpu_kind(anchor["gpu"]).arch.startswith("cdna"):
        return False
    if not has_indexer(anchor):
        cut = sglang_cut_no_earlier(anchor)
        return cut is not None and cut >= SGLANG_PIECEWISE_GRAPH_DATE
    built = sglang_build_date(anchor)
    return built is not None and built >= SGLANG_DSA_PREFILL_GRAPH_DATE


# SGLang kept GLM-5 (GlmMoeDsaForCausalLM) on Blackwell out of its dense short prefill (``MHA_ONE_SHOT``) from
# sgl-project/sglang#18521 (398b81f78, "Force NSA prefill to use MLA (i.e. disable MHA_ONE_SHOT) for
# GlmMoeDsaForCausalLM on SM100"; at 947927bdb, the GLM-5 cookbook's commit) until #21332 (d097cd221, "Apply trtllm
# MHA kernel for GLM-5 on Blackwell"): [since, until).
SGLANG_GLM_BLACKWELL_SPARSE_PREFILL = (datetime.date(2026, 2, 10), datetime.date(2026, 6, 3))


def is_glm5(anchor: dict) -> bool:
    """Whether the row serves a GLM-5.x model (the ``glm-5*`` presets, ``GlmMoeDsaForCausalLM``), whose SGLang rules
    differ from DeepSeek's by build."""
    return anchor["model"].lower().startswith("glm-5")


def engine_dense_short_prefill(anchor: dict) -> bool:
    """Whether the row's engine may run a prefill within top-k keys as dense MHA (``SimConfig.dense_short_prefill``):
    the step time's rule (``kernels.sglang_dense_short_prefill``) except for a GLM-5.x row (the ``glm-5*`` presets,
    ``GlmMoeDsaForCausalLM``) on Blackwell in an SGLang build of ``SGLANG_GLM_BLACKWELL_SPARSE_PREFILL``."""
    if policy_of(anchor) == "mixed" or gpu_kind(anchor["gpu"]).arch != "blackwell" or not has_indexer(anchor):
        return True
    if not is_glm5(anchor):
        return True
    built = sglang_build_date(anchor)
    since, until = SGLANG_GLM_BLACKWELL_SPARSE_PREFILL
    return built is None or not since <= built < until


def engine_kv_dtype(anchor: dict) -> str:
    """The row's ``kv`` or, when empty, its engine's default main-KV format: bf16 for vLLM, which stores the
    fp8_ds_mla format only when ``--kv-cache-dtype fp8`` is given (``DeepseekV32ForCausalLM.verify_and_update_config``;
    the default "auto", the checkpoint's bf16 activations, since vllm-project/vllm#27121, 2025-10-17; v0.13.0 came
    out 2025-12-19), and for SGLang on Hopper (the anchors' README) or a model without the indexer; SGLang serving a
    DSA model on Blackwell takes ``SGLANG_BLACKWELL_DSA_KV`` at its build date (bf16 before the first entry or with
    no version named). docs/steptime.md, fact 19."""
    text = (anchor.get("kv") or "").strip()
    if text:
        return text
    if policy_of(anchor) == "mixed" or gpu_kind(anchor["gpu"]).arch != "blackwell" or not has_indexer(anchor):
        return "bf16"
    built = sglang_build_date(anchor)
    kv = "bf16"
    for since, without_dp, with_dp in SGLANG_BLACKWELL_DSA_KV:
        if built is not None and built >= since:
            kv = with_dp if _int(anchor.get("dp"), 1) > 1 else without_dp
    return kv


def range_ratio_of(anchor: dict) -> float:
    """The row's ``range_ratio`` column, else its client's: InferenceX's 0.8, fixed lengths (1) otherwise."""
    text = (anchor.get("range_ratio") or "").strip()
    if text:
        ratio = float(text)
        if not 0 <= ratio <= 1:
            raise DsakvError(f"anchor {anchor['id']}: range_ratio = {text}: must be in [0, 1]")
        return ratio
    return INFERENCEX_RANGE_RATIO if "inferencex" in (anchor.get("src") or "").lower() else 1.0


def has_indexer(anchor: dict) -> bool:
    """Whether the served model has DSA's lightning indexer: an ``indexer`` column (1 / 0) if present, else
    False for ``r1-*`` rows (DeepSeek-R1: dense MLA, no ``index_*`` fields in its config; the anchors README
    names the DSA preset a proxy for its linear / MoE layers) and True otherwise."""
    text = (anchor.get("indexer") or "").strip().lower()
    if text:
        if text not in ("0", "1", "true", "false"):
            raise DsakvError(f"anchor {anchor['id']}: indexer = {text}: must be 1 / 0 / true / false")
        return text in ("1", "true")
    return not anchor["id"].lower().startswith("r1-")


def client_lengths(requests: list[TraceRequest], ratio: float, seed: int = 0) -> list[TraceRequest]:
    """The benchmark client's lengths: each request's input and output drawn uniformly (seeded) from
    [int(ratio x len), len], as benchmark_serving.py's random dataset does; ratio 1 keeps them."""
    if ratio >= 1:
        return requests
    rng = random.Random(seed)
    out = []
    for r in requests:
        isl = rng.randint(max(int(r.input_length * ratio), 1), r.input_length)
        osl = rng.randint(max(int(r.output_length * ratio), 1), r.output_length)
        out.append(dataclasses.replace(r, input_length=isl, output_length=osl))
    return out


def frontend_service(measured: tuple[tuple[int, float], ...] = FRONTEND_MEASURED) -> tuple[float, float]:
    """The front-end's service time as a line through the measured (prompt tokens, seconds) points, least squares:
    (seconds per request, seconds per prompt token) for ``SimConfig.frontend_request_s`` / ``frontend_token_s``."""
    fit = statistics.linear_regression([t for t, _ in measured], [s for _, s in measured])
    return fit.intercept, fit.slope


def engine_moe_a2a(anchor: dict) -> tuple[str, int]:
    """The row's MoE all-to-all (``moe_a2a`` column: ``deepep`` where the source passes ``--moe-a2a-backend
    deepep``; empty = none, the all-reduce) and the expert-parallel size it implies: SGLang sets ``ep_size`` to
    ``tp_size`` under DeepEP (``ServerArgs._handle_a2a_moe``); 1 otherwise."""
    a2a = (anchor.get("moe_a2a") or "").strip().lower() or "none"
    if a2a not in MOE_A2A:
        raise DsakvError(f"anchor {anchor['id']}: moe_a2a = {a2a!r}: must be empty or one of {', '.join(MOE_A2A[1:])}")
    return a2a, (_int(anchor["gpus"]) if a2a == "deepep" else 1)


# The environment variables a row's source sets that change what the replay prices (``env`` column, ``NAME=VALUE``
# separated by spaces): vLLM's switches for DeepGEMM's grouped MoE GEMMs. Unset, vLLM's tensor-parallel fp8 experts
# run Triton's fused MoE on Hopper; set to 1 (and neither to 0), DeepGEMM's (``SimConfig.moe_deep_gemm``,
# docs/steptime.md fact 36).
ENGINE_ENV = ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM")


# The benchmark clients a row's ``client`` column may name: empty, a serving client (``vllm bench serve``,
# ``sglang.bench_serving``, guidellm, aiperf) that sends each request to the OpenAI or ``/generate`` endpoint with its
# text, through the server's front-end (``FRONTEND_S`` and the measured tokenizer queue); ``one_batch``,
# ``sglang.bench_one_batch_server``, which posts one ``/generate`` request carrying every prompt's token ids
# (``input_ids``: no tokenization, one HTTP request), replayed without the queue (its measured service time is
# tokenizing a request's text, which this client skips) but with ``FRONTEND_S``: the fitted latency is not the
# tokenizer's (that is the queue, a few ms a request) and the batch's requests still pass the same server path to
# the scheduler and back (docs/steptime.md, fact 9).
CLIENTS = ("", "one_batch")


def engine_frontend(anchor: dict) -> tuple[float, float, float]:
    """(``frontend_s``, ``frontend_request_s``, ``frontend_token_s``) for the row's ``client``: the serving clients'
    front-end, or its latency without the tokenizer's queue for ``one_batch``; another value is an error naming the
    choices."""
    client = (anchor.get("client") or "").strip().lower()
    if client not in CLIENTS:
        raise DsakvError(
            f"anchor {anchor['id']}: client = {client!r}: must be empty or one of {', '.join(CLIENTS[1:])}"
        )
    if client == "one_batch":
        return FRONTEND_S, 0.0, 0.0
    return FRONTEND_S, FRONTEND_REQUEST_S, FRONTEND_TOKEN_S


def engine_env(anchor: dict) -> dict[str, str]:
    """The row's ``env`` column as a dict; a name outside ``ENGINE_ENV`` or a value other than 0 / 1 is an error."""
    env = {}
    for item in (anchor.get("env") or "").split():
        name, sep, value = item.partition("=")
        if not sep or name not in ENGINE_ENV or value not in ("0", "1"):
            raise DsakvError(
                f"anchor {anchor['id']}: env = {item!r}: must be NAME=0 or NAME=1 with NAME one of {', '.join(ENGINE_ENV)}"
            )
        env[name] = value
    return env


# SGLang's automatic MoE runner on Blackwell (SM100 / SM103) takes TensorRT-LLM's fused MoE (``flashinfer_trtllm``)
# for a DeepSeek-family model's fp8 experts without an all-to-all (``kernels.sglang_trtllm_moe``, fact 37) from these
# builds on, by model: DeepSeek-V3 / R1 (dense MLA) from sgl-project/sglang#11816 (f80371ff8, 2025-10-23);
# DeepSeek-V3.2, which SGLang loads as ``DeepseekV3ForCausalLM`` (its config rewritten by ``_load_deepseek_v32_model``
# since #11061, efbc687c2, until #24295 registered the name), once #13687 (618ca2380, 2025-11-23) moved the choice out
# of the branch for models without DSA; GLM-5.x (``GlmMoeDsaForCausalLM``) from its support, #18521 (398b81f78,
# 2026-02-10).
SGLANG_TRTLLM_MOE_SINCE = {
    "dense-mla": datetime.date(2025, 10, 23),
    "deepseek-v3.2": datetime.date(2025, 11, 23),
    "glm-5": datetime.date(2026, 2, 10),
}


def engine_moe_trtllm(anchor: dict) -> bool:
    """Whether the row's engine may run the routed experts in TensorRT-LLM's fused MoE (``SimConfig.moe_trtllm``; the
    step time applies it to SGLang rows on Blackwell with fp8 experts and no all-to-all only): an SGLang build on or
    after ``SGLANG_TRTLLM_MOE_SINCE`` for the row's model (a build naming no version predates it)."""
    if policy_of(anchor) == "mixed" or gpu_kind(anchor["gpu"]).arch != "blackwell":
        return True
    if not has_indexer(anchor):
        family = "dense-mla"
    else:
        family = "glm-5" if is_glm5(anchor) else "deepseek-v3.2"
    built = sglang_build_date(anchor)
    return built is not None and built >= SGLANG_TRTLLM_MOE_SINCE[family]


# SGLang's ROCm image runs AITER's kernels (``SGLANG_USE_AITER=1``; ``kernels.sglang_aiter``, facts 38-39) at the
# rates of AITER's tuned GLM-5 tables on MI355X: its fp8 GEMMs' since ROCm/aiter#2518 (35eea80490, 2026-03-29), its
# fused MoE's since #2658 (9cc2b8ae4e, 2026-04-10; last changed by #2719, 2026-04-13). A build cut before both ran
# kernels with no published time.
AITER_GLM5_TABLES_SINCE = datetime.date(2026, 4, 13)


def engine_aiter(anchor: dict) -> bool:
    """Whether the row's engine may run AITER's kernels at their published rates (``SimConfig.aiter``; the step time
    applies it to SGLang rows on CDNA 4 with an fp8 checkpoint and no all-to-all only): an SGLang build on or after
    ``AITER_GLM5_TABLES_SINCE`` (a build naming no version predates it)."""
    if policy_of(anchor) == "mixed" or gpu_kind(anchor["gpu"]).arch != "cdna4":
        return True
    built = sglang_build_date(anchor)
    return built is not None and built >= AITER_GLM5_TABLES_SINCE


def engine_moe_deep_gemm(anchor: dict) -> bool:
    """Whether the row's engine runs the routed experts in DeepGEMM's grouped GEMMs (``SimConfig.moe_deep_gemm``):
    where its source sets ``VLLM_USE_DEEP_GEMM=1`` or ``VLLM_MOE_USE_DEEP_GEMM=1`` and neither at 0 (the step time
    applies it to vLLM rows on Hopper only: ``kernels.vllm_deep_gemm_moe_min_tokens``; unset, vLLM's tensor-parallel
    experts run Triton's fused MoE)."""
    env = engine_env(anchor)
    return bool(env) and all(value == "1" for value in env.values())


def accept_of(anchor: dict) -> float | tuple[float, ...]:
    """The row's ``accept``: one acceptance probability for every draft position, or one per position separated by
    spaces (``1 1 0.5 0 0``: SGLang's ``SGLANG_SIMULATE_ACC_LEN`` = 3.5 on 5 draft steps, half the steps accepting
    two drafts and half three); 0.8 when empty."""
    text = (anchor.get("accept") or "").strip()
    if not text:
        return 0.8
    try:
        values = tuple(float(v) for v in text.split())
    except ValueError:
        raise DsakvError(
            f"anchor {anchor['id']}: accept = {text!r}: must be a probability or one per draft position, "
            "separated by spaces"
        ) from None
    return values[0] if len(values) == 1 else values


ACCEPT_DRAWS = ("request", "batch")


def accept_shared(anchor: dict) -> bool:
    """Whether the row's engine drew one accept length per step for its whole batch (``accept_draw`` ``batch``:
    SGLang's ``SGLANG_SIMULATE_ACC_LEN``, whose ``generate_simulated_accept_index`` gives every request of the
    batch the one sampled length) rather than one per request (``request`` or empty)."""
    text = (anchor.get("accept_draw") or "").strip() or "request"
    if text not in ACCEPT_DRAWS:
        raise DsakvError(f"anchor {anchor['id']}: accept_draw = {text!r}: must be one of {', '.join(ACCEPT_DRAWS)}")
    return text == "batch"


def dense_mla_available_bytes(layout: CacheLayout, memory: RankMemory, weight_dtype: str | None) -> int:
    """A rank's bytes for the cache of the DSA proxy's model without its indexer: the planner's split ``memory``
    (``rank_memory``), plus the indexer's weights (``wq_b``, ``wk``, ``weights_proj``: replicated on every rank) and
    the top-k buffer, which a dense-MLA checkpoint does not have."""
    parts = weight_parts(layout.spec, layout.mtp_layers, weight_dtype)
    indexer = sum(p.bytes for p in parts if p.name.startswith("indexer")) if memory.weights_computed else 0
    return memory.available_bytes + indexer + memory.topk_buffer_bytes


def engine_pool_tokens(anchor: dict, cfg: SimConfig) -> int | None:
    """The pool the row's engine builds, where it differs from the planner's.

    A model without the indexer (``has_indexer``: DeepSeek-R1 / V3 on the DSA preset as a proxy) caches the MLA
    latent only: the planner's bytes for the pool in pages of the main cache alone, less the same scratch pages.
    An SGLang build before ``SGLANG_SKIP_TOPK_INDEXER_DATE`` (or naming no version) builds the lightning indexer on
    every layer of a DSA model, also where the model computes it on some layers only (GLM-5.2's IndexCache: 21 full
    of 78): an ``Indexer`` module, whose weights every rank holds (replicated), and its cache (``DSATokenToKVPool``
    allocates ``index_k_with_scale_buffer`` for each of its ``layer_num`` layers, and ``DefaultPoolConfigurator``
    counts the indexer row ``num_layers`` times in the cell): the pool of the same deployment with the indexer full
    on every layer. None (the planner's pool) for vLLM rows of DSA models, later SGLang builds, and models with the
    indexer on every layer already."""
    if not has_indexer(anchor):
        layout = build_setup(cfg).layout
        capacity = pool_capacity(layout, cfg.gpu)
        main_page = capacity.page_bytes * layout.main_page_bytes // layout.page_bytes  # a rank page, main cache only
        available = dense_mla_available_bytes(layout, capacity.memory, cfg.gpu.weight_dtype)
        pages = max(available // main_page - capacity.scratch_pages, 1)
        return pages * capacity.group_page_tokens
    if policy_of(anchor) == "mixed":
        return None
    built = sglang_build_date(anchor)
    if built is not None and built >= SGLANG_SKIP_TOPK_INDEXER_DATE:
        return None
    layout = build_setup(cfg).layout
    spec = layout.spec
    if spec.num_full_indexer_layers == spec.num_hidden_layers:
        return None
    every_layer = dataclasses.replace(layout, spec=spec.with_all_indexers_full())
    return pool_capacity(every_layer, cfg.gpu).pool_tokens  # its weights and its cache on every layer


def sim_config(anchor: dict) -> SimConfig:
    chunk = engine_chunk_tokens(anchor)
    gpus = _int(anchor["gpus"])
    moe_a2a, ep = engine_moe_a2a(anchor)
    setting = GpuSetting(
        gpu=anchor["gpu"],
        num_gpus=gpus,
        dp_attention=_int(anchor.get("dp"), 1),
        mem_fraction_static=engine_mem_fraction(anchor),
        weight_dtype=(anchor.get("weight_dtype") or None),
        max_batched_tokens=engine_step_tokens(anchor, chunk),
        moe_a2a=moe_a2a,
        activation_bytes=DEFAULT_ACTIVATION_BYTES + engine_workspace_bytes(anchor),
    )
    victim_order, requeue = engine_preemption(anchor)
    frontend_s, frontend_request_s, frontend_token_s = engine_frontend(anchor)
    cfg = SimConfig(
        model=anchor["model"],
        gpu=setting,
        kv_dtype=engine_kv_dtype(anchor),
        num_speculative_tokens=_int(anchor.get("mtp"), 0),
        mtp_accept=accept_of(anchor),
        mtp_accept_shared=accept_shared(anchor),
        spec_overlap=engine_spec_overlap(anchor),
        overlap_schedule=engine_overlap_schedule(anchor),
        scheduler_recv_interval=engine_recv_interval(anchor),
        mixed_chunk=engine_mixed_chunk(anchor),
        prefill_graph=engine_prefill_graph(anchor),
        dense_short_prefill=engine_dense_short_prefill(anchor),
        moe_deep_gemm=engine_moe_deep_gemm(anchor),
        moe_trtllm=engine_moe_trtllm(anchor),
        aiter=engine_aiter(anchor),
        chunk_tokens=chunk,
        max_running=engine_max_running(anchor),
        new_token_ratio=engine_new_token_ratio(anchor),
        new_token_clip=engine_new_token_clip(anchor),
        new_token_ratio_min=engine_new_token_ratio_min(anchor),
        new_token_ratio_decay_steps=SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
        victim_order=victim_order,
        requeue=requeue,
        schedule_policy=policy_of(anchor),
        max_concurrency=_int(anchor.get("conc")),
        ep=ep,
        frontend_s=frontend_s,
        frontend_request_s=frontend_request_s,
        frontend_token_s=frontend_token_s,
    )
    pool = engine_pool_tokens(anchor, cfg)
    return cfg if pool is None else dataclasses.replace(cfg, pool_tokens=pool)


FRONTEND_REQUEST_S, FRONTEND_TOKEN_S = frontend_service()


@dataclass(frozen=True)
class Metric:
    """A published figure as its source defines it; ``rate`` figures compare dsakv / published (higher is faster),
    the others published / dsakv, so a ratio above 1 always means dsakv is too fast."""

    name: str
    rate: bool
    definition: str


# The figures an anchor's ``published`` may carry (docs/calibration-data.md, "Metrics"): each is named for what its
# sources count. Per-request figures take [value, "mean" | "p50" | "p90" | "p95" | "p99"] (a bare number = mean);
# throughputs divide by the benchmark's duration and count every finished request of every DP group.
METRICS = {
    m.name: m
    for m in (
        Metric("ttft_ms", False, "client send -> first output token, per request"),
        Metric("tpot_ms", False, "(last token - first token) / (output tokens - 1), per request of >= 2 tokens"),
        Metric("e2e_ms", False, "client send -> last output token, per request"),
        Metric(
            "e2e_per_token_ms", False, "E2E latency / output tokens, per request (guidellm 'time per output token')"
        ),
        Metric("duration_s", False, "first client send -> last finish ('Benchmark duration')"),
        Metric(
            "batch_itl_ms",
            False,
            "(last finish - last first token) / output tokens: sglang.bench_one_batch_server's ITL, 1000 x batch / "
            "output throughput, for one batch of requests of equal lengths",
        ),
        Metric("req_s", True, "finished requests / duration ('Request throughput')"),
        Metric("out_tok_s", True, "output tokens / duration, whole instance ('Output token throughput')"),
        Metric("out_tok_s_gpu", True, "out_tok_s / GPUs of the instance ('Output tput/GPU')"),
        Metric("in_tok_s", True, "input tokens / duration, whole instance ('Input token throughput')"),
        Metric("in_tok_s_gpu", True, "in_tok_s / GPUs of the instance ('Input tput/GPU')"),
        Metric("total_tok_s", True, "(input + output tokens) / duration ('Total Token throughput', 'Total TPS')"),
        Metric("total_tok_s_gpu", True, "total_tok_s / GPUs of the instance ('Total tput/GPU')"),
    )
}
STATS = ("mean", "p50", "p90", "p95", "p99", "max")


def _stat(values: list[float], how: str) -> float:
    """The mean or a percentile (linear interpolation between ranks, as numpy.percentile in vllm bench serve and
    sglang.bench_serving) of a non-empty list."""
    if how == "mean":
        return statistics.fmean(values)
    if how == "max":
        return max(values)
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(how[1:]) - 1]


def published_of(anchor: dict) -> list[tuple[str, float, str]]:
    """The row's published figures as (metric, value, statistic); an unknown metric or statistic, or a value that is
    not a positive number, raises ``DsakvError`` naming the row and what is allowed."""
    try:
        figures = json.loads(anchor.get("published") or "")
    except json.JSONDecodeError:
        raise DsakvError(f"anchor {anchor.get('id')}: published = {anchor.get('published')!r}: not JSON") from None
    if not isinstance(figures, dict) or not figures:
        raise DsakvError(f"anchor {anchor.get('id')}: published must be a non-empty JSON object of metric: value")
    out = []
    for metric, value in figures.items():
        if metric not in METRICS:
            raise DsakvError(f"anchor {anchor['id']}: unknown metric {metric!r} (known: {', '.join(METRICS)})")
        number, how = (value[0], value[1]) if isinstance(value, list) else (value, "mean")
        if how not in STATS:
            raise DsakvError(f"anchor {anchor['id']}: {metric} statistic {how!r}: must be one of {', '.join(STATS)}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
            raise DsakvError(f"anchor {anchor['id']}: {metric} = {number!r}: must be a positive number")
        out.append((metric, float(number), how))
    return out


def engine_of(anchor: dict) -> str:
    """The row's engine: its ``engine`` column, else ``sglang`` / ``vllm`` as ``policy_of`` reads the id and note."""
    engine = (anchor.get("engine") or "").strip().lower()
    return engine or ("sglang" if policy_of(anchor) == "prefill_first" else "vllm")


def family_of(anchor: dict) -> str:
    """The row's family for the summary: engine x GPU x MTP on/off x DP attention on/off."""
    mtp = "on" if (_int(anchor.get("mtp"), 0) or 0) > 0 else "off"
    dp = "on" if (_int(anchor.get("dp"), 1) or 1) > 1 else "off"
    return f"{engine_of(anchor)} {anchor['gpu']} mtp-{mtp} dp-{dp}"


def _figures(result, cfg: SimConfig) -> dict:
    """Every metric of ``METRICS`` from a replay's finished requests: name -> f(statistic) -> value."""
    done = [r for r in result.records if r.outcome == "finished"]
    if not done:
        raise DsakvError("no request finished in the replay")
    gpus = cfg.gpu.num_gpus
    duration = max(r.finish_s for r in done) - min(r.arrival_s for r in done)
    out_tok_s = sum(r.output_tokens for r in done) / duration  # every DP group simulated
    in_tok_s = sum(r.input_tokens for r in done) / duration
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    per_request = {
        "ttft_ms": [1000 * r.ttft_s for r in done],
        "tpot_ms": [1000 * t for t in tpots],
        "e2e_ms": [1000 * (r.finish_s - r.arrival_s) for r in done],
        "e2e_per_token_ms": [1000 * (r.finish_s - r.arrival_s) / r.output_tokens for r in done if r.output_tokens],
    }
    last_first_token = max(r.arrival_s + r.ttft_s for r in done)
    whole = {
        "duration_s": duration,
        "batch_itl_ms": 1000 * (max(r.finish_s for r in done) - last_first_token) / max(r.output_tokens for r in done),
        "req_s": len(done) / duration,
        "out_tok_s": out_tok_s,
        "out_tok_s_gpu": out_tok_s / gpus,
        "in_tok_s": in_tok_s,
        "in_tok_s_gpu": in_tok_s / gpus,
        "total_tok_s": out_tok_s + in_tok_s,
        "total_tok_s_gpu": (out_tok_s + in_tok_s) / gpus,
    }
    figures = {m: functools.partial(_per_request, m, v) for m, v in per_request.items()}
    figures.update({m: (lambda how, v=v: v) for m, v in whole.items()})
    return figures


def _per_request(metric: str, values: list[float], how: str) -> float:
    if not values:
        raise DsakvError(f"no finished request has a {metric}")
    return _stat(values, how)


def replay_inputs(anchor: dict, traces: Path, step_params: dict | None = None) -> tuple:
    """What a replay of one anchor runs, as its client ran it: (its ``SimConfig``, its ``SimSetup``, the client's
    requests, the trace's counters). ``step_params`` override the roofline's fields (and ``frontend_s``, the
    config's). Raises ``DsakvError`` when the row cannot be replayed."""
    cfg = sim_config(anchor)
    step_params = dict(step_params or {})
    if "frontend_s" in step_params:
        cfg = dataclasses.replace(cfg, frontend_s=step_params.pop("frontend_s"))
    setup = build_setup(cfg)
    step_params.setdefault("has_indexer", has_indexer(anchor))
    setup = dataclasses.replace(setup, step_time=dataclasses.replace(setup.step_time, **step_params))
    with tempfile.TemporaryDirectory() as tmp:
        opened = open_source(Source(trace=str(trace_of(anchor, traces, Path(tmp)))))
        requests = client_lengths(list(opened.requests), range_ratio_of(anchor))
    return cfg, setup, requests, opened.counters


def run_replay(anchor: dict, traces: Path, step_params: dict | None = None):
    """Simulate one anchor's benchmark (``replay_inputs``): (its ``SimConfig``, the run's result, whose ``records``
    hold every request)."""
    cfg, setup, requests, counters = replay_inputs(anchor, traces, step_params)
    return cfg, run(cfg, requests, setup=setup, counters=counters)


def replay(anchor: dict, traces: Path, step_params: dict | None = None) -> list[Row]:
    """Run one anchor and compare every figure it publishes; ``step_params`` override the roofline's fields
    (and ``frontend_s``, the config's). Raises ``DsakvError`` when the row cannot be replayed."""
    published = published_of(anchor)
    cfg, result = run_replay(anchor, traces, step_params)
    figures = _figures(result, cfg)
    rows, family = [], family_of(anchor)
    for metric, value, how in published:
        ours = figures[metric](how)
        ratio = ours / value if METRICS[metric].rate else value / ours
        lo, hi = BANDS.get(metric, DEFAULT_BAND)
        rows.append(Row(anchor["id"], metric, value, ours, ratio, lo <= ratio <= hi, family))
    return rows


def _make_traces():
    spec = importlib.util.spec_from_file_location(
        "make_traces", Path(__file__).parent / "calibration" / "make_traces.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace_of(anchor: dict, traces: Path, scratch: Path) -> Path:
    """The row's workload: ``traces/<id>.jsonl`` when committed, else the trace ``make_traces.py`` writes from the
    row's n / isl / osl / rate (written under ``scratch``; the same lines, so a committed copy would be identical)."""
    committed = traces / f"{anchor['id']}.jsonl"
    if committed.is_file():
        return committed
    path = scratch / f"{anchor['id']}.jsonl"
    path.write_text("\n".join(_make_traces().trace_lines(anchor)) + "\n")
    return path


def replay_or_error(anchor: dict, traces: Path, step_params: dict | None = None) -> list[Row]:
    """``replay``, or one error row per published figure when the row cannot be replayed (weights larger than the
    GPU, a request that can never fit, nothing finished): the run goes on with the other rows."""
    try:
        return replay(anchor, traces, step_params)
    except DsakvError as exc:
        text = str(exc).removeprefix(f"anchor {anchor['id']}: ")
        nan, family = math.nan, family_of(anchor)
        return [Row(anchor["id"], m, v, nan, nan, False, family, text) for m, v, _ in published_of(anchor)]


def replay_rows(anchors: list[dict], traces: Path, step_params: dict | None = None, jobs: int = 1) -> list[Row]:
    """Every anchor's rows (``replay_or_error``), in file order, replayed in ``jobs`` forked processes on Linux (in
    this one elsewhere: macOS's system libraries are not safe to fork, Windows cannot); each replay is independent
    and seeded, so the rows are the same at any ``jobs``."""
    jobs = min(jobs, len(anchors))
    if jobs <= 1 or not sys.platform.startswith("linux"):
        return [row for a in anchors for row in replay_or_error(a, traces, step_params)]
    work = functools.partial(replay_or_error, traces=traces, step_params=step_params)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        return [row for rows in pool.map(work, anchors) for row in rows]


def jobs_of(value: int) -> int:
    """``--jobs``: a count of processes, 0 for one per CPU; a negative one raises ``DsakvError``."""
    if value < 0:
        raise DsakvError(f"--jobs {value}: must be 0 (one per CPU) or a count of processes")
    return value or os.cpu_count() or 1


def check_anchors(anchors: list[dict], traces: Path) -> None:
    """A malformed file fails before any replay (exit 2): every row has an id, known metrics and a trace (committed,
    or n / isl / osl to generate it from)."""
    for a in anchors:
        if not (a.get("id") or "").strip():
            raise DsakvError("an anchor row has an empty id")
        published_of(a)
        family_of(a)
        if not (traces / f"{a['id']}.jsonl").is_file():
            shape = [(a.get(k) or "").strip() for k in ("n", "isl", "osl")]
            if not all(v.isdigit() and int(v) > 0 for v in shape):
                raise DsakvError(
                    f"anchor {a['id']}: no trace {traces / (a['id'] + '.jsonl')} and n / isl / osl = {shape} "
                    "are not positive integers to generate it from"
                )


def _ok(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.error is None]


def geomeans(rows: list[Row]) -> dict[str, float]:
    """The geometric mean of each metric's ratios over the rows that replayed."""
    by: dict[str, list[float]] = {}
    for r in _ok(rows):
        by.setdefault(r.metric, []).append(math.log(r.ratio))
    return {m: math.exp(statistics.fmean(v)) for m, v in by.items()}


def geomeans_out(rows: list[Row]) -> dict[str, float]:
    """The metrics whose geometric mean lies outside ``GEOMEAN_BAND``."""
    low, high = GEOMEAN_BAND
    return {m: v for m, v in geomeans(rows).items() if not low <= v <= high}


def worst(rows: list[Row]) -> Row | None:
    ok = _ok(rows)
    return max(ok, key=lambda r: abs(math.log(r.ratio))) if ok else None


@dataclass(frozen=True)
class FamilyLine:
    """One family's figures for one metric: rows, rows out of band, error rows, geometric mean and worst ratio."""

    family: str
    metric: str
    rows: int
    out: int
    errors: int
    geomean: float | None
    worst: float | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def families(rows: list[Row]) -> list[FamilyLine]:
    """The per-family summary (engine x GPU x MTP x DP), families and metrics in order of first appearance."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.family, r.metric), []).append(r)
    out = []
    for (family, metric), group in groups.items():
        ok = _ok(group)
        mean = math.exp(statistics.fmean(math.log(r.ratio) for r in ok)) if ok else None
        bad = worst(group)
        out.append(
            FamilyLine(family, metric, len(group), sum(not r.band_ok for r in ok), len(group) - len(ok), mean,
                       bad.ratio if bad else None)
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class Decoders:
    """A row's mean number of requests decoding at once, by Little's law over its output tokens: output tokens per
    second x mean TPOT (a decoding request emits one token per TPOT), from the published figures and from the
    replay's by the same formula. It localizes a miss: where TPOT is right and the throughput is not, the engine
    kept a different number of requests decoding (its pool, its admission, its preemptions), not priced a step
    differently. Approximate on both sides alike (first tokens and the ramp are in the throughput); not banded."""

    id: str
    published: float
    dsakv: float
    ratio: float  # dsakv / published: above 1, dsakv keeps more requests decoding than the engine did

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# The output throughputs ``decoders`` reads, in order of preference: the whole instance's, then per GPU (times the row's GPUs).
DECODER_THROUGHPUTS = ("out_tok_s", "out_tok_s_gpu")


def decoders(rows: list[Row], anchors: list[dict]) -> list[Decoders]:
    """``Decoders`` of every replayed row that publishes a mean TPOT and an output throughput (``out_tok_s``, else
    ``out_tok_s_gpu`` times the row's GPUs), in the rows' order."""
    by = {(r.id, r.metric): r for r in _ok(rows)}
    out = []
    for a in anchors:
        stats = {metric: how for metric, _, how in published_of(a)}
        rate = next((m for m in DECODER_THROUGHPUTS if (a["id"], m) in by), None)
        tpot = by.get((a["id"], "tpot_ms"))
        if rate is None or tpot is None or stats.get("tpot_ms") != "mean":
            continue
        gpus = 1 if rate == "out_tok_s" else _int(a.get("gpus"), 1)
        tokens = by[(a["id"], rate)]
        published = tokens.published * gpus * tpot.published / 1000
        ours = tokens.dsakv * gpus * tpot.dsakv / 1000
        out.append(Decoders(a["id"], published, ours, ours / published))
    return out


def loss(rows: list[Row]) -> float:
    """Sum of squared log ratios over the rows that replayed: a 2x miss either way costs the same."""
    return sum(math.log(r.ratio) ** 2 for r in _ok(rows))


def settings_of(items: list[str]) -> dict[str, float]:
    """``--set NAME=VALUE`` items as ``replay``'s ``step_params``; a name outside ``SETTABLE``, a value that is not a
    number or one outside the roofline's range raises ``DsakvError``."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in SETTABLE:
            raise DsakvError(f"--set {item!r}: NAME=VALUE with NAME one of {', '.join(SETTABLE)}")
        try:
            out[name] = float(text)
        except ValueError:
            raise DsakvError(f"--set {item!r}: VALUE must be a number") from None
    roofline = {k: v for k, v in out.items() if k != "frontend_s"}
    if roofline:  # the roofline checks the ranges: a bad value is bad input (exit 2), not an error row per anchor
        probe = build_setup(SimConfig(model="tiny", gpu=GpuSetting(num_gpus=1))).step_time
        dataclasses.replace(probe, **roofline)
    return out


def fit(anchors: list[dict], traces: Path, jobs: int = 1) -> list[tuple[float, int, dict]]:
    """Replay every anchor at every ``FIT_GRID`` point; (loss, rows out of band, params), best first (fewest
    rows out of band, then the smallest loss)."""
    points = []
    for values in itertools.product(*FIT_GRID.values()):
        params = dict(zip(FIT_GRID, values))
        rows = replay_rows(anchors, traces, params, jobs)
        points.append((loss(rows), sum(not r.band_ok for r in rows), params))
    return sorted(points, key=lambda p: (p[1], p[0]))


def evaluate(anchors: list[dict], traces: Path, params: dict, jobs: int = 1) -> tuple[int, float]:
    """(rows out of band, loss) of every anchor replayed with ``params``; error rows count as out of band."""
    rows = replay_rows(anchors, traces, params, jobs)
    return sum(not r.band_ok for r in rows), loss(rows)


def refine(
    anchors: list[dict], traces: Path, start: dict, rounds: int = 4, log=print, jobs: int = 1
) -> tuple[dict, tuple]:
    """Coordinate descent from ``start`` over ``REFINE_BOUNDS``: each parameter in turn is multiplied / divided by
    a step factor while (rows out, loss) improves; the factor shrinks 1.5 -> 1.22 -> 1.1 -> 1.05 over the rounds."""
    best, score = dict(start), evaluate(anchors, traces, start, jobs)
    log(f"refine start out {score[0]} loss {score[1]:.4f}")
    for factor in (1.5, 1.22, 1.1, 1.05)[:rounds]:
        for name, (lo, hi) in REFINE_BOUNDS.items():
            for direction in (factor, 1 / factor):
                moved = False
                while True:
                    value = min(max(best[name] * direction, lo), hi)
                    if value == best[name]:
                        break
                    trial = {**best, name: value}
                    got = evaluate(anchors, traces, trial, jobs)
                    if got >= score:
                        break
                    best, score, moved = trial, got, True
                    log(f"refine x{factor:g} {name} {value:.4g}: out {got[0]} loss {got[1]:.4f}")
                if moved:
                    break
    return best, score


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", required=True, help="anchors.csv (traces/<id>.jsonl beside it)")
    ap.add_argument("--json", action="store_true", help="print the rows, geometric means, families and worst as JSON")
    ap.add_argument("--only", help="comma-separated anchor ids to replay")
    ap.add_argument("--fit", action="store_true", help="search FIT_GRID for the roofline's free parameters")
    ap.add_argument("--refine", action="store_true", help="coordinate descent over REFINE_BOUNDS from the defaults")
    ap.add_argument(
        "--jobs", type=int, default=1, help="replay in N forked processes on Linux (0: one per CPU; default 1)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="replay with a roofline field or frontend_s set (SETTABLE), e.g. mla_prefill_eff=0.35; repeatable",
    )
    return ap


def read_anchors(path: Path, only: str | None = None) -> list[dict]:
    """The CSV's rows (``only``: those ids, each of which must be in the file), checked by ``check_anchors``."""
    with path.open(newline="") as f:
        anchors = list(csv.DictReader(f))
    if only:
        keep = only.split(",")
        missing = sorted(set(keep) - {a.get("id") for a in anchors})
        if missing:
            raise DsakvError(f"--only: no anchor {', '.join(missing)} in {path}")
        anchors = [a for a in anchors if a["id"] in keep]
    check_anchors(anchors, path.parent / "traces")
    return anchors


def _fmt(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if value is None or math.isnan(value) else f"{value:>{width}.{digits}f}"


def render(rows: list[Row], settings: dict, concurrency: list[Decoders] | None = None) -> None:
    """The human table: one line per figure, the errors, the geometric means, the family summary, the decoding
    concurrency (``decoders``) and the worst."""
    print(f"{'id':<28} {'metric':<15} {'published':>11} {'dsakv':>11} {'ratio':>6}  band")
    for r in rows:
        band = "ERROR" if r.error else ("ok" if r.band_ok else "OUT")
        print(f"{r.id:<28} {r.metric:<15} {r.published:>11.2f} {_fmt(r.dsakv, 11)} {_fmt(r.ratio, 6)}  {band}")
    for anchor_id, text in dict.fromkeys((r.id, r.error) for r in rows if r.error):
        print(f"error: {anchor_id}: {text}")
    print("geometric mean: " + ", ".join(f"{m} {v:.2f}" for m, v in geomeans(rows).items()))
    out = geomeans_out(rows)
    if out:
        low, high = GEOMEAN_BAND
        print(f"geometric means outside {low}-{high}: " + ", ".join(f"{m} {v:.2f}" for m, v in out.items()))
    print(f"{'family':<32} {'metric':<15} {'rows':>4} {'out':>4} {'error':>5} {'geomean':>7} {'worst':>6}")
    for f in families(rows):
        print(
            f"{f.family:<32} {f.metric:<15} {f.rows:>4} {f.out:>4} {f.errors:>5} {_fmt(f.geomean, 7)} "
            f"{_fmt(f.worst, 6)}"
        )
    if concurrency:
        print(f"{'decoding at once (out tok/s x mean TPOT)':<44} {'published':>11} {'dsakv':>11} {'ratio':>6}")
        for d in concurrency:
            print(f"{d.id:<44} {d.published:>11.1f} {d.dsakv:>11.1f} {d.ratio:>6.2f}")
    bad = worst(rows)
    if bad is not None:
        print(f"worst: {bad.id} {bad.metric} ratio {bad.ratio:.2f}; loss {loss(rows):.3f}")
    if settings:
        print("set: " + "  ".join(f"{k} {v:g}" for k, v in settings.items()))


def _search(args, anchors: list[dict], traces: Path) -> dict | None:
    """--fit / --refine: the best point found (the fit's table printed unless --json), else None."""
    best = None
    if args.fit:
        points = fit(anchors, traces, args.jobs)
        best = points[0][2]
        if not args.json:
            for value, out, params in points:
                print(f"fit loss {value:8.3f}  out {out:2d}  " + "  ".join(f"{k} {v:g}" for k, v in params.items()))
    if args.refine:
        start = {name: getattr(RooflineStepTime, name) for name in REFINE_BOUNDS if name != "frontend_s"}
        best, _ = refine(anchors, traces, {**start, "frontend_s": FRONTEND_S}, jobs=args.jobs)
        print("refined: " + "  ".join(f"{k} {v:.4g}" for k, v in best.items()))
    return best


def run_cli(main_fn) -> int:
    """A bench script's ``main()``, ended quietly when its reader closes the pipe early (``| head``): exit status 1,
    no traceback. stdout then points at /dev/null, so Python's flush at exit cannot fail again (the Python docs'
    "Note on SIGPIPE")."""
    try:
        return main_fn()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path = Path(args.anchors)
    try:
        settings = settings_of(args.set)
        args.jobs = jobs_of(args.jobs)
        if settings and (args.fit or args.refine):
            raise DsakvError("--set: replays the rows at the given values; not with --fit / --refine")
        anchors = read_anchors(path, args.only)
        if not anchors:
            raise DsakvError(f"no anchor rows in {path}")
        best = _search(args, anchors, path.parent / "traces")
        rows = replay_rows(anchors, path.parent / "traces", best or settings, args.jobs)
    except (OSError, KeyError, ValueError, DsakvError) as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        bad = worst(rows)
        out = {
            "rows": [r.to_dict() for r in rows],
            "geomean": geomeans(rows),
            "geomean_out": geomeans_out(rows),
            "families": [f.to_dict() for f in families(rows)],
            "decoders": [d.to_dict() for d in decoders(rows, anchors)],
            "worst": bad.to_dict() if bad else None,
            "loss": loss(rows),
        }
        if best is not None:
            out["fit"] = best
        if settings:
            out["set"] = settings
        print(json.dumps(out))
    else:
        render(rows, settings, decoders(rows, anchors))
    return 0 if all(r.band_ok for r in rows) and not geomeans_out(rows) else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
