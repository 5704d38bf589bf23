"""Configuration of one simulation (``SimConfig``, frozen, picklable for sweep workers) and what it
resolves to (``SimSetup``): spec, cache layout, pool capacity from the planner, step-time model, scheduler
configuration. Building a setup reads no trace and changes nothing.

The pool comes from the planner's one door, ``dsakv.planner.budget.pool_capacity``, for the configured layout
on the nested GPU setting (``SimConfig.gpu``, a ``GpuSetting``: default GLM-5.3 on 8 x H200, TP8) or on
``available_bytes``, unless ``pool_tokens`` overrides it: the very call ``dsakv plan`` makes, so both print the
same pool for the same flags (the weights are the configured layout's own: its indexer schedule, its MTP
layers). The simulator's allocator hands out page ids from the planner's ``PoolCapacity.scratch_pages`` on.

Pages are the planner's rank pages: ``page_size x dcp`` tokens of the attention group each (under DCP the
group's tokens are interleaved over the DCP ranks; a rank page holds ``page_size`` main rows and the
replicated indexer K of all ``page_size x dcp`` tokens), so the allocator and the radix tree work at that
granularity, as the engine's do. Under DP attention the setup is that of one attention-DP group (its own
pool and prefix cache); the driver (``dsakv.sim.cluster``) routes each request to a group by the router.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dsakv.cache.eviction import get_policy
from dsakv.cache.radix import INSERT_MODES, PAGE_KEYS
from dsakv.cache.tiers import DEFAULT_HIT_THRESHOLD, WRITE_THROUGH, WritePolicy
from dsakv.errors import DsakvError, check_choice
from dsakv.kvevents.endpoint import check_instance_endpoints
from dsakv.planner.budget import PoolCapacity, RankCell, pool_capacity, require_pool
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.tiers import tier_capacity
from dsakv.scheduler.config import SCHEDULE_POLICIES, SchedulerConfig
from dsakv.scheduler.policies import check_mode, check_requeue, check_victim_order
from dsakv.sim.routing import ROUTERS, SHARDABLE_ROUTERS
from dsakv.sim.step_settings import apply_step_settings
from dsakv.sim.steptime import (
    ConstantStepTime,
    RooflineStepTime,
    check_accept,
    sglang_aiter,
    sglang_batch1_at_reference,
    sglang_dense_short_prefill,
    sglang_prefill_in_decode_kernel,
    sglang_tilelang,
    sglang_trtllm_gen_decode,
    sglang_trtllm_moe,
    vllm_deep_gemm_moe_min_tokens,
    vllm_mixed_batch,
    vllm_padded_topk,
    vllm_prefill_kernel_all,
)
from dsakv.sim.transfers import DEFAULT_STORE_GBPS, TierSetup
from dsakv.spec.layout import CUDA_PAGE_SIZE, CacheLayout
from dsakv.spec.model_spec import ModelSpec, load_spec
from dsakv.spec.patterns import apply_indexer_pattern, indexer_patterns

STEP_MODELS = ("roofline", "constant")
UNBOUNDED = "unbounded"  # a tier size without limit
# Largest pool the simulator runs (2**23 pages: 536,870,912 tokens at 64 per page). The page allocator keeps a
# flag byte per page and, once the pool has cycled, an 8-byte id per free page (9 B a page, 75 MB at the limit,
# with the radix tree's per-page arrays on top); real DSA pools are a few
# thousand to a million pages (GLM-5.3 on 8 x H200: 8,981; the tiny model on one MI300X: 934,862).
MAX_SIM_POOL_PAGES = 2**23


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one run. ``gpu`` is the deployment (``GpuSetting``: GPU kind or memory, GPUs, TP, DP attention,
    DCP, memory knobs); its ``max_batched_tokens`` is also the scheduler's token budget per step.
    ``indexer_pattern``: the indexer schedule, None (as configured), ``all``, a full-layer count, an F/S string
    or an IndexCache pattern name (whether the model has an indexer at all is the step time's ``has_indexer``).
    ``num_speculative_tokens``: k, the speculative (MTP draft) tokens proposed and verified per decode step
    (vLLM's name; SGLang's ``speculative_num_steps``; 0 = off; on, the pool holds one MTP cache layer);
    ``mtp_accept``: each draft position's acceptance probability, one for all or a tuple of k (position i
    accepted only if 1 .. i-1 were: ``check_accept``); ``mtp_accept_shared``: one acceptance draw per step for the
    whole batch, as SGLang's simulated acceptance (``SGLANG_SIMULATE_ACC_LEN``: ``generate_simulated_accept_index``
    samples one accept length per verify and gives it to every request of the batch), each request taking at most
    its own drafts of it; False: each request draws its own; ``mtp_index_share``: SGLang's
    ``index_share_for_mtp_iteration``, the draft steps reuse the draft extend's top-k instead of scoring the
    MTP layer's indexer (step time only; no effect at k 0 or 1, so a sweep over k may keep it on); ``spec_overlap``:
    False runs speculative steps as SGLang's EAGLE V1 does, without the overlap scheduler (the host's work of each
    step exposed: the step time's ``spec_host_s``); ``overlap_schedule``: the scheduler plans each step while the one
    before it runs, as SGLang's overlap scheduler does (``Scheduler.event_loop_overlap``; on by default there, off
    under EAGLE V1): a request that reaches a busy engine joins the second step after, not the next
    (``dsakv.sim.cluster``); ``scheduler_recv_interval``: n > 1 (with ``prefill_first``, SGLang's policy) receives
    new requests as SGLang's ``SchedulerRecvSkipper`` does (``--scheduler-recv-interval n``): each loop turn adds 1
    after a decode (or verify) step and 1,000 after a step with prefill tokens, and the turn that brings the count to
    n receives and starts it again, so a request reaching a decoding engine waits up to n - 1 more steps (an idle loop
    receives at once); ``mixed_chunk``: SGLang's ``--enable-mixed-chunk`` (``Scheduler._get_new_batch_prefill_raw``
    mixes the running decodes into a prefill batch whose prompt tokens it cuts by their count): the scheduler plans
    as the ``mixed`` policy does while the engine stays ``prefill_first``'s (its kernels and admission); only with
    ``prefill_first`` and without speculative decoding, which SGLang refuses it with; ``prefill_graph``: False runs
    prefill forwards eagerly, as SGLang does on a DSA model (a launch floor under every step with prefill tokens: the
    step time's ``eager_layer_s``);
    ``dense_short_prefill``: False keeps a prefill whose sequences hold at most top-k keys in the sparse kernels, where
    the engine's rule would run it as dense MHA (``kernels.sglang_dense_short_prefill``; SGLang turned it off for GLM-5
    on Blackwell from sgl-project/sglang#18521, 2026-02-10, to #21332, 2026-06-03). ``moe_deep_gemm``: True runs
    vLLM's routed experts in DeepGEMM's grouped GEMMs at every step size, as its launch with
    ``VLLM_MOE_USE_DEEP_GEMM=1`` does on Hopper; by default (False) they stay in Triton's fused MoE
    (``kernels.vllm_deep_gemm_moe_min_tokens``).
    ``moe_trtllm``: False keeps the routed experts out of TensorRT-LLM's fused MoE, where SGLang on Blackwell runs
    a DeepSeek-family model's fp8 experts in it without an all-to-all (``kernels.sglang_trtllm_moe``; another
    ``--moe-runner-backend``, or a build before SGLang chose it). ``aiter``: False prices SGLang on CDNA 4 without AITER's
    kernels, where it runs an fp8 checkpoint's experts in AITER's fused MoE and its linear layers in AITER's fp8
    GEMMs without an all-to-all (``kernels.sglang_aiter``; ``SGLANG_USE_AITER=0``).
    ``ep``: expert parallelism (step time only; the MoE's collectives are the deployment's ``gpu.moe_a2a``, which
    also sets where the shared experts' weights live). ``schedule_policy``: the scheduler's
    (mixed, vLLM-like; prefill_first, SGLang-like). ``max_concurrency``: closed-loop replay, request k starts
    when request k - C finishes (None: open loop, trace timestamps); one client for the whole cluster, whatever
    the instances and DP groups (a finish in any group starts the next request). ``frontend_s``: seconds from a
    client sending a request to the engine's scheduler queuing it (HTTP, tokenization, the hop from the API
    server to the scheduler): the request's arrival is the client's send time, so its TTFT and the makespan
    include it (default 0: the engine's own TTFT; docs/steptime.md, front-end latency). ``frontend_request_s`` /
    ``frontend_token_s``: the service time of the one front-end process every request passes first, in send
    order (per request and per prompt token; ``dsakv.sim.frontend``; default 0: no queue; one instance only).
    ``instances``: engine instances of the cluster, each of ``gpu`` (``dsakv.sim.cluster``); ``router``: which
    of their DP groups a request goes to (``ROUTERS``). ``kv_events_endpoint`` (and
    ``kv_events_replay_endpoint``): a ZMQ address from which the instances publish their KV events, in vLLM's
    wire format, to the kv-aware router's subscribers, instead of in process (docs/kv_events.md).
    ``new_token_ratio``: the share of a request's remaining output the admission reserves
    (``SchedulerConfig.new_token_ratio``, SGLang's ``init_new_token_ratio``), of at most ``new_token_clip``
    remaining tokens (``SchedulerConfig.new_token_clip``, SGLang's 4096; None: no clip), decaying to
    ``new_token_ratio_min`` over ``new_token_ratio_decay_steps`` decode steps as SGLang's tracker does
    (``SchedulerConfig``; None: a constant ratio). ``victim_order`` and
    ``requeue``: who is preempted first and where it waits again (``SchedulerConfig``; vLLM's ``newest`` /
    ``front`` by default, SGLang's ``fewest_outputs`` / ``back``). ``page_keys``: what the radix
    trees key a page on (``RadixCache``): ``"digest"`` (the default here, while ``RadixCache`` defaults to
    ``"tokens"`` for the engine's one tree), a 16-byte digest of its tokens, so a cached page costs 16 bytes of
    key instead of ``4 x page_size`` and a thousand instances' trees fit in memory; ``"tokens"``, the exact
    token ids (``--page-keys tokens``). The figures are the same either way; with MTP drafts the trees key
    bigrams, on tokens whatever this says (``radix_page_keys``). ``workers``: the processes a cluster's
    instances are split among (``dsakv.sim.shards``; the same figures as one process): more than 1 only for a
    router that reads no instance state (``SHARDABLE_ROUTERS``), an open loop, and at least as many
    instances."""

    model: str | None = None
    config: str | None = None
    gpu: GpuSetting = field(default_factory=GpuSetting)
    available_bytes: int | None = None
    kv_dtype: str = "fp8_ds_mla"
    kpool: int = 1  # index_kpool: one indexer state per kpool tokens
    page_size: int | None = None  # None: 64 x kpool (the indexer's physical page stays 64, the CUDA rule)
    num_speculative_tokens: int = 0  # k: speculative (MTP draft) tokens per decode step; 0: off
    mtp_accept: float | tuple[float, ...] = 0.8  # one probability, or one per draft position
    mtp_accept_shared: bool = False  # one acceptance draw per step for the batch (SGLANG_SIMULATE_ACC_LEN)
    mtp_index_share: bool = False  # index_share_for_mtp_iteration: draft steps reuse the draft extend's top-k
    spec_overlap: bool = True  # False: SGLang EAGLE V1 (no overlap scheduler on speculative steps)
    overlap_schedule: bool = False  # True: SGLang's overlap scheduler (a request reaching a busy engine waits a step)
    scheduler_recv_interval: int = 1  # SGLang's --scheduler-recv-interval: a busy loop receives every n-th decode turn
    mixed_chunk: bool = False  # SGLang's --enable-mixed-chunk: a step with prefill work carries every running decode
    prefill_graph: bool = True  # False: eager prefill forwards (SGLang on a DSA model)
    dense_short_prefill: bool = True  # False: no dense MHA for prefills within top-k (SGLang GLM-5, Blackwell)
    moe_deep_gemm: bool = False  # True: vLLM's VLLM_MOE_USE_DEEP_GEMM=1 (DeepGEMM's grouped GEMMs at every step size)
    moe_trtllm: bool = True  # False: SGLang on Blackwell with another --moe-runner-backend than flashinfer_trtllm
    aiter: bool = True  # False: SGLang on CDNA 4 without AITER's kernels (SGLANG_USE_AITER=0)
    indexer_pattern: str | None = (
        None  # the indexer schedule (None: as configured); the step time's has_indexer is another thing
    )
    pool_tokens: int | None = None
    eviction_policy: str = "lru"
    insert_mode: str = "finish"
    prefix_cache: bool = True
    preemption: str = "recompute"
    victim_order: str = "newest"
    requeue: str = "front"
    chunk_tokens: int = 8192
    max_running: int = 256
    new_token_ratio: float = 0.7
    new_token_clip: int | None = None
    new_token_ratio_min: float | None = None
    new_token_ratio_decay_steps: int = 600
    time_scale: float = 1.0
    step_model: str = "roofline"
    seed: int = 0
    ep: int = 1
    schedule_policy: str = "mixed"
    max_concurrency: int | None = None
    frontend_s: float = 0.0
    frontend_request_s: float = 0.0
    frontend_token_s: float = 0.0
    # lower tiers (dsakv.sim.transfers): host memory per node and the shared store, in bytes ("unbounded": no
    # limit) or in tokens (``*_tokens``, one of the two per tier); None for both: no such tier
    host_bytes: int | str | None = None
    host_tokens: int | None = None
    store_bytes: int | str | None = None
    store_tokens: int | None = None
    store_gbps: float = DEFAULT_STORE_GBPS
    write_policy: str = WRITE_THROUGH
    hit_threshold: int = DEFAULT_HIT_THRESHOLD  # write_through_selective: device hits before a page goes down
    instances: int = 1
    router: str = "round-robin"
    # the KV-aware router's events over real ZMQ sockets (instance i publishes at the port + i; replay
    # sockets at kv_events_replay_endpoint's port + i); None: in process. The figures are the same either way.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    page_keys: str = "digest"
    workers: int = 1
    # the roofline's efficiencies / fixed costs replaced, as (field, value) pairs (``dsakv.sim.step_settings``:
    # ``dsakv simulate --step-settings FILE``, written by ``dsakv calibrate --log``)
    step_settings: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GpuSetting):
            raise DsakvError(f"gpu = {self.gpu!r}: must be a GpuSetting")
        get_policy(self.eviction_policy)
        check_mode(self.preemption)
        check_victim_order(self.victim_order)
        check_requeue(self.requeue)
        check_choice("insert_mode", self.insert_mode, INSERT_MODES)
        check_choice("page_keys", self.page_keys, PAGE_KEYS)
        check_choice("step_model", self.step_model, STEP_MODELS)
        ts = self.time_scale
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts < float("inf"):
            raise DsakvError(f"time_scale = {ts!r}: must be a positive number (2 = replay twice as slowly)")
        self._check_engine()
        c = self.max_concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise DsakvError(f"max_concurrency = {c!r}: must be a positive integer (closed loop) or None")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise DsakvError(f"instances = {self.instances!r}: must be a positive integer")
        check_choice("router", self.router, ROUTERS)
        self._check_kv_events()
        self._check_workers()
        if self.instances > 1 and (self.frontend_request_s or self.frontend_token_s):
            raise DsakvError(
                f"frontend_request_s / frontend_token_s with instances = {self.instances}: the front-end queue is "
                "modelled for one instance (its one API process); use instances = 1 or no front-end service time"
            )
        if self.pool_tokens is not None and (not isinstance(self.pool_tokens, int) or self.pool_tokens < 0):
            raise DsakvError(f"pool_tokens = {self.pool_tokens!r}: must be an integer >= 0")
        self._check_tiers()
        WritePolicy(self.write_policy, self.hit_threshold)
        if self.has_tiers and not self.prefix_cache:
            raise DsakvError("host/store tiers need the prefix cache (they hold its pages); drop --no-prefix-cache")

    def _check_engine(self) -> None:
        """The speculative, scheduler-loop and front-end knobs, and the SGLang flags that need its policy."""
        n = self.scheduler_recv_interval
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DsakvError(
                f"scheduler_recv_interval = {n!r}: must be a positive integer (1: receive every loop turn)"
            )
        for name in ("num_speculative_tokens", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DsakvError(f"{name} = {v!r}: must be an integer >= 0")
        object.__setattr__(self, "mtp_accept", check_accept(self.mtp_accept, self.num_speculative_tokens))
        for name in (
            "mtp_accept_shared", "mtp_index_share", "spec_overlap", "overlap_schedule", "prefill_graph",
            "dense_short_prefill", "moe_deep_gemm", "moe_trtllm", "aiter", "mixed_chunk",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise DsakvError(f"{name} = {getattr(self, name)!r}: must be True or False")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise DsakvError(f"ep = {self.ep!r}: must be a positive integer")
        for name in ("frontend_s", "frontend_request_s", "frontend_token_s"):
            fe = getattr(self, name)
            if isinstance(fe, bool) or not isinstance(fe, (int, float)) or not 0 <= fe < float("inf"):
                raise DsakvError(f"{name} = {fe!r}: must be a number of seconds >= 0")
        check_choice("schedule_policy", self.schedule_policy, SCHEDULE_POLICIES)
        if self.scheduler_recv_interval > 1 and self.schedule_policy != "prefill_first":
            raise DsakvError(
                f"scheduler_recv_interval = {self.scheduler_recv_interval}: SGLang's --scheduler-recv-interval needs "
                f"schedule_policy prefill_first, not {self.schedule_policy} (1: receive every loop turn)"
            )
        if self.mixed_chunk and self.schedule_policy != "prefill_first":
            raise DsakvError(
                f"mixed_chunk = True: SGLang's --enable-mixed-chunk needs schedule_policy prefill_first, not "
                f"{self.schedule_policy} (the mixed policy mixes already)"
            )
        if self.mixed_chunk and self.num_speculative_tokens:
            raise DsakvError(
                "mixed_chunk = True: SGLang turns mixed chunks off under speculative decoding (set 0 drafts)"
            )
        low = self.new_token_ratio_min
        if low is not None and (isinstance(low, bool) or not isinstance(low, int | float) or not 0 <= low <= 1):
            raise DsakvError(f"new_token_ratio_min = {low!r}: must be None (a constant ratio) or a number in [0, 1]")
        d = self.new_token_ratio_decay_steps
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise DsakvError(f"new_token_ratio_decay_steps = {d!r}: must be a positive integer")
        clip = self.new_token_clip
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int) or clip < 1):
            raise DsakvError(f"new_token_clip = {clip!r}: must be a positive number of tokens or None (no clip)")

    def _check_tiers(self) -> None:
        """Each lower tier's size, given one way, and the store's link."""
        for tier in ("host", "store"):
            size, tokens = getattr(self, f"{tier}_bytes"), getattr(self, f"{tier}_tokens")
            if size is not None and tokens is not None:
                raise DsakvError(f"{tier}_bytes and {tier}_tokens: give the {tier} tier's size one way, not both")
            if (
                size is not None
                and size != UNBOUNDED
                and (isinstance(size, bool) or not isinstance(size, int) or size < 0)
            ):
                raise DsakvError(f"{tier}_bytes = {size!r}: must be an integer >= 0 or {UNBOUNDED!r}")
            if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
                raise DsakvError(f"{tier}_tokens = {tokens!r}: must be an integer >= 0")
        gbps = self.store_gbps
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not 0 < gbps < float("inf"):
            raise DsakvError(f"store_gbps = {gbps!r}: must be a positive number of GB/s")

    def _check_kv_events(self) -> None:
        if self.kv_events_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise DsakvError("kv_events_replay_endpoint: needs kv_events_endpoint (replay serves what PUB sent)")
        if self.kv_events_endpoint is None:
            return
        if self.router != "kv-aware":
            raise DsakvError(
                f"kv_events_endpoint = {self.kv_events_endpoint!r}: feeds the kv-aware router's index; "
                f"router = {self.router!r} reads no events"
            )
        check_instance_endpoints(
            "kv_events_endpoint",
            self.kv_events_endpoint,
            "kv_events_replay_endpoint",
            self.kv_events_replay_endpoint,
            self.instances,
        )

    def _check_workers(self) -> None:
        """Several workers each route the whole stream and keep their instances' requests: exact only when no
        instance's history depends on another's (docs/routing.md, Workers)."""
        w = self.workers
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise DsakvError(f"workers = {w!r}: must be a positive integer")
        if w == 1:
            return
        if self.router not in SHARDABLE_ROUTERS:
            raise DsakvError(
                f"workers = {w} with router = {self.router!r}: that router reads the instances' state, so one "
                f"process must route; use workers = 1 or a router that reads none ({', '.join(SHARDABLE_ROUTERS)})"
            )
        if self.max_concurrency is not None:
            raise DsakvError(
                f"workers = {w} with max_concurrency = {self.max_concurrency}: the closed loop ties every "
                "instance's arrivals to the others' finishes; use workers = 1 or the open loop"
            )
        if self.instances < w:
            raise DsakvError(
                f"workers = {w} with instances = {self.instances}: each worker simulates at least one instance; "
                "use workers <= instances"
            )

    @property
    def radix_page_keys(self) -> str:
        """What the radix trees key on: ``page_keys``, except token keys with MTP drafts (bigram keys reach one
        token into the next page, which a page's digest cannot)."""
        return "tokens" if self.num_speculative_tokens > 0 else self.page_keys

    @property
    def has_tiers(self) -> bool:
        return any(getattr(self, f) is not None for f in ("host_bytes", "host_tokens", "store_bytes", "store_tokens"))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SimSetup:
    """What a ``SimConfig`` resolves to: the spec and cache layout, the planner's pool, the step-time model
    and the scheduler configuration. ``num_pages`` are rank pages of ``group_page_tokens`` (page_size x dcp) tokens."""

    spec: ModelSpec
    layout: CacheLayout
    setting: GpuSetting
    capacity: PoolCapacity
    cell: RankCell
    num_pages: int  # pool pages handed out (the planner's scratch pages come on top: capacity.scratch_pages)
    group_page_tokens: int  # tokens of one page: page_size x dcp (a DCP group's rank page; page_size at dcp 1)
    pool_source: str
    step_time: RooflineStepTime | ConstantStepTime
    scheduler: SchedulerConfig
    tiers: TierSetup | None = None

    def to_dict(self) -> dict:
        return {
            **({} if self.tiers is None else {"tiers": self.tiers.to_dict()}),
            "model": self.spec.to_dict(),
            "layout": self.layout.to_dict(),
            "gpu_setting": self.setting.to_dict(),
            "pool": {**self.capacity.to_dict(), "simulator_pages": self.num_pages, "source": self.pool_source},
            "group_page_tokens": self.group_page_tokens,
            "cell": self.cell.to_dict(),
            "step_time": self.step_time.to_dict(),
            "scheduler": asdict(self.scheduler),
        }


def _apply_indexer(spec: ModelSpec, indexer: str | None) -> ModelSpec:
    if indexer is None or indexer == "":
        return spec
    if indexer == "all":
        return spec.with_all_indexers_full()
    if indexer.isdigit():
        count = int(indexer)
        return spec if count == spec.num_full_indexer_layers else spec.with_full_indexer_count(count)
    return apply_indexer_pattern(spec, indexer, indexer_patterns())


def _step_time(cfg: SimConfig, layout: CacheLayout) -> RooflineStepTime | ConstantStepTime:
    """The step-time model of ``cfg`` on ``layout``: the roofline with the engine's kernel choices (the ``kernels``
    predicates, from the schedule policy, the GPU's generation and the cache format), or the constant model."""
    if cfg.step_model == "constant":
        return ConstantStepTime()
    setting = cfg.gpu
    arch, policy = gpu_kind(setting.gpu).arch, cfg.schedule_policy
    checkpoint_dtype = setting.weight_dtype or layout.spec.weight_dtype  # the weights the kernel rules read
    return RooflineStepTime(
        layout,
        gpu_kind(setting.gpu),
        tp=setting.tensor_parallel,
        dp_attention=setting.dp_attention,
        dcp=setting.dcp,
        ep=cfg.ep,
        moe_a2a=setting.moe_a2a,
        weight_dtype=setting.weight_dtype,
        num_speculative_tokens=cfg.num_speculative_tokens,
        mtp_accept=cfg.mtp_accept,
        mtp_index_share=cfg.mtp_index_share,
        spec_overlap=cfg.spec_overlap,
        prefill_graph=cfg.prefill_graph,
        mla_mixed_batch=vllm_mixed_batch(layout, setting.tensor_parallel, setting.dp_attention, policy)
        or sglang_prefill_in_decode_kernel(layout, arch, policy),
        mla_prefill_kernel_all=vllm_prefill_kernel_all(layout, policy),
        mla_padded_topk=vllm_padded_topk(policy),
        mla_dense_short_prefill=cfg.dense_short_prefill and sglang_dense_short_prefill(layout, arch, policy),
        mla_decode_trtllm_gen=sglang_trtllm_gen_decode(layout, arch, policy),
        batch1_at_reference=sglang_batch1_at_reference(layout, arch, policy),
        mla_tilelang=sglang_tilelang(layout, arch, policy),
        moe_deep_gemm_min_tokens=vllm_deep_gemm_moe_min_tokens(arch, policy, checkpoint_dtype, cfg.moe_deep_gemm),
        moe_trtllm=sglang_trtllm_moe(arch, policy, checkpoint_dtype, setting.moe_a2a, cfg.moe_trtllm),
        aiter=sglang_aiter(arch, policy, checkpoint_dtype, setting.moe_a2a, cfg.aiter),
    )


def build_setup(cfg: SimConfig) -> SimSetup:
    """Resolve a config; an impossible one (no pool page, bad sizes) raises ``DsakvError`` with the reason."""
    base_spec = load_spec(cfg.model, cfg.config)
    spec = _apply_indexer(base_spec, cfg.indexer_pattern)
    mtp_layers = 1 if cfg.num_speculative_tokens else 0  # MTP cache layers: the one MTP layer drafts
    page_size = cfg.page_size if cfg.page_size is not None else CUDA_PAGE_SIZE * cfg.kpool
    layout = CacheLayout(spec, kv_dtype=cfg.kv_dtype, mtp_layers=mtp_layers, page_size=page_size, index_kpool=cfg.kpool)
    setting = cfg.gpu
    capacity = pool_capacity(layout, setting, available_bytes=cfg.available_bytes)  # the one door, as dsakv plan
    group_page_tokens = capacity.group_page_tokens
    if cfg.pool_tokens is not None:
        pages, source = cfg.pool_tokens // group_page_tokens, "--pool-tokens"
        if pages < 1:
            raise DsakvError(
                f"pool_tokens = {cfg.pool_tokens}: the pool must hold at least one page of {group_page_tokens} tokens"
                + (f" (page_size {layout.page_size} x dcp {setting.dcp})" if setting.dcp > 1 else "")
            )
    else:
        require_pool(capacity)  # the same check (and words) as dsakv plan
        pages = capacity.num_pages
        source = "--available-bytes" if cfg.available_bytes is not None else "planner (GPU setting)"
    if pages > MAX_SIM_POOL_PAGES:
        what = f"pool_tokens = {cfg.pool_tokens:,}" if cfg.pool_tokens is not None else f"the {source} pool"
        raise DsakvError(
            f"{what}: {pages:,} pages of {group_page_tokens} tokens; the simulator takes at most "
            f"{MAX_SIM_POOL_PAGES:,} pages ({MAX_SIM_POOL_PAGES * group_page_tokens:,} tokens): its page allocator "
            f"keeps a flag byte and, once used, an 8-byte id per free page in memory"
        )
    step_time = apply_step_settings(_step_time(cfg, layout), cfg.step_settings)
    chunk = max(group_page_tokens, cfg.chunk_tokens // group_page_tokens * group_page_tokens)
    sched = SchedulerConfig(
        max_batched_tokens=max(setting.max_batched_tokens, group_page_tokens),
        chunk_tokens=chunk,
        max_running=cfg.max_running,
        new_token_ratio=cfg.new_token_ratio,
        new_token_clip=cfg.new_token_clip,
        new_token_ratio_min=cfg.new_token_ratio_min,
        new_token_ratio_decay_steps=cfg.new_token_ratio_decay_steps,
        max_context=spec.max_position_embeddings,
        preemption=cfg.preemption,
        victim_order=cfg.victim_order,
        requeue=cfg.requeue,
        num_speculative_tokens=cfg.num_speculative_tokens,
        # SGLang's mixed chunks: its prefill batch carries the running decodes, as the mixed policy plans a step
        schedule_policy="mixed" if cfg.mixed_chunk else cfg.schedule_policy,
    )
    cell = RankCell(layout, setting.dcp)
    tiers = tier_setup(cfg, cell, setting) if cfg.has_tiers else None
    return SimSetup(spec, layout, setting, capacity, cell, pages, group_page_tokens, source, step_time, sched, tiers)


def _tier_pages(
    size: int | str | None, tokens: int | None, pages_of_bytes: int | None, group_page_tokens: int
) -> int | None:
    if size == UNBOUNDED:
        return None
    if tokens is not None:
        return tokens // group_page_tokens
    return pages_of_bytes


def tier_setup(cfg: SimConfig, cell: RankCell, setting: GpuSetting) -> TierSetup:
    """The simulated group's tiers: host pages by the planner's rule (one copy per attention group and node,
    ``dsakv.planner.tiers``), the store shared by the deployment's ``pools`` groups (this group's share)."""
    host_b = cfg.host_bytes if isinstance(cfg.host_bytes, int) else None
    store_b = cfg.store_bytes if isinstance(cfg.store_bytes, int) else None
    cap = tier_capacity(cell, setting, host_b, store_b)
    group_page_tokens = cell.group_page_tokens
    kind = gpu_kind(setting.gpu)
    store_pages = _tier_pages(cfg.store_bytes, cfg.store_tokens, cap.store_pages, group_page_tokens)
    if store_pages is not None and cfg.store_bytes is not None:
        store_pages //= setting.pools
    return TierSetup(
        has_host=cfg.host_bytes is not None or cfg.host_tokens is not None,
        host_pages=_tier_pages(cfg.host_bytes, cfg.host_tokens, cap.host_pages, group_page_tokens),
        has_store=cfg.store_bytes is not None or cfg.store_tokens is not None,
        store_pages=store_pages,
        write_policy=cfg.write_policy,
        hit_threshold=cfg.hit_threshold,
        rank_page_bytes=cell.page_bytes,
        entry_bytes=cap.entry_bytes,
        entry_main_bytes=cell.layout.main_page_bytes * cell.dcp,
        entry_indexer_bytes=cell.layout.indexer_page_bytes * cell.dcp,
        host_link=kind.host_link,
        host_link_bytes_per_s=kind.host_link_bytes_per_s,
        store_bytes_per_s=cfg.store_gbps * 1e9,
    )
