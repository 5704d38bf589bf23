"""``EngineConfig`` and the engine's name registries. No torch here: the CLI reads ``POOL_KINDS`` for its
``--pool-kind`` choices without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsakv.cache.events import HASH_FUNCTIONS
from dsakv.cache.eviction import POLICIES
from dsakv.cache.radix import INSERT_MODES
from dsakv.cache.tiers import WRITE_POLICIES
from dsakv.errors import DsakvError, check_choice
from dsakv.kvevents.endpoint import check_endpoint
from dsakv.scheduler.config import SchedulerConfig
from dsakv.spec.layout import INDEXER_DTYPES, KV_DTYPES
from dsakv.store.config import StoreConfig

POOL_KINDS = ("slot", "packed")  # TwinPool layouts: one buffer per layer (SGLang) or one block per page (vLLM)
SPECULATIVE_ALGORITHMS = ("mtp",)  # EngineConfig.speculative: the model's own MTP layer drafts (engine/speculative.py)
SCRATCH_SEQS = 8  # sequences whose padding rows share the scratch pages in one forward (more: another forward)


@dataclass(frozen=True)
class EngineConfig:
    num_pages: int = 256  # pages the allocator hands out (the pool adds scratch pages for padding rows)
    page_size: int = 64
    pool_kind: str = "slot"  # "slot" (SGLang) or "packed" (vLLM)
    index_kpool: int = 1  # indexer states merged per N tokens: the pool holds them, the compute path refuses N > 1
    dcp: int = 1  # decode-context-parallel ranks (emulated in one process): a page id holds page_size x dcp tokens
    dcp_replicated: bool = False  # dcp > 1 only: every rank holds the whole pool (no main-KV sharding), docs/pool.md
    kv_dtype: str = "fp8_ds_mla"
    indexer_dtype: str = "fp8"  # "fp32" with kv_dtype "fp32": the exact cache mode (no rounding)
    prefix_cache: bool = True
    insert_mode: str = "finish"  # radix insertion: "finish" or "allocate"
    eviction_policy: str = "lru"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    logits_budget_bytes: int | None = None  # indexer logits budget (row chunking); None: the default rule
    batch_invariant: bool = True
    min_rows: int = 16  # batch invariance: each sequence's forward rows are padded to at least this many
    capture_cache: bool = False  # keep each finished request's cache read-back
    seed: int = 0
    # Lower tiers (dsakv.engine.lower_tiers); either needs the prefix cache.
    host_bytes: int | None = None  # host tier: bytes of both caches in host memory (whole pages); None: no host tier
    store_url: str | None = None  # shared store: redis://HOST:PORT/DB; None: no store
    store_connect_timeout_s: float = 1.0  # bound on one connection attempt to the store
    store_command_timeout_s: float = 2.0  # bound on one pipelined batch of store commands
    store_budget_bytes: int | None = None  # the store server's maxmemory (allkeys-lru); None: leave the server's
    write_policy: str = "write_through"  # when pages go down a tier: write_through, write_back, write_through_selective
    # the chained page hash (events, store keys): the store trusts it alone, so a store holding billions of pages
    # wants blake2b's 32 bytes over xxh3_64's 8 (docs/store.md)
    hash_name: str = "xxh3_64"
    # KV events in vLLM's wire format (the ``events`` extra): PUB and replay (ROUTER) addresses to bind
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    # the first frame of every PUB message (vLLM's KVEventsConfig.topic; its example subscriber's is "kv-events")
    kv_events_topic: str = ""
    metrics: bool = False  # keep Prometheus metrics in the engine's own registry (the ``metrics`` extra)
    # Speculative decoding with the model's MTP layer; docs/scheduler.md (SGLang's and vLLM's names for these).
    speculative: str | None = None  # "mtp", or None: off
    # k, the draft chain length: speculative tokens proposed and verified per decode step (vLLM's
    # num_speculative_tokens; SGLang's speculative_num_steps, its speculative_num_draft_tokens being k + 1 for
    # a chain); 0 with speculative = "mtp": the MTP layer runs and fills its cache, nothing is drafted
    num_speculative_tokens: int = 0
    eagle_topk: int = 1  # drafts per chain step: chains only (tree drafting with topk > 1 is not built)
    index_share_for_mtp_iteration: bool = False  # chain steps after the first reuse the previous step's top-k

    def __post_init__(self) -> None:
        for name in ("num_pages", "page_size", "min_rows", "dcp", "index_kpool"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DsakvError(f"{name} = {value!r}: must be a positive integer")
        if not isinstance(self.dcp_replicated, bool):
            raise DsakvError(f"dcp_replicated = {self.dcp_replicated!r}: must be True or False")
        if self.dcp_replicated and self.dcp == 1:
            raise DsakvError("dcp_replicated = True: only meaningful with dcp > 1 (one rank holds every token anyway)")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise DsakvError(f"scheduler = {self.scheduler!r}: must be a SchedulerConfig")
        names = {
            "pool_kind": POOL_KINDS,
            "kv_dtype": KV_DTYPES,
            "indexer_dtype": INDEXER_DTYPES,
            "insert_mode": INSERT_MODES,
            "eviction_policy": POLICIES,
        }
        for name, allowed in names.items():
            check_choice(name, getattr(self, name), allowed)
        check_choice("write_policy", self.write_policy, WRITE_POLICIES)
        check_choice("hash_name", self.hash_name, HASH_FUNCTIONS)
        if self.host_bytes is not None and (
            isinstance(self.host_bytes, bool) or not isinstance(self.host_bytes, int) or self.host_bytes < 1
        ):
            raise DsakvError(f"host_bytes = {self.host_bytes!r}: must be a positive integer (bytes) or None")
        if self.store_url is not None:
            StoreConfig(  # one-line errors for a bad URL, timeout or budget, before anything is built
                self.store_url,
                connect_timeout_s=self.store_connect_timeout_s,
                command_timeout_s=self.store_command_timeout_s,
                budget_bytes=self.store_budget_bytes,
            )
        if (self.host_bytes is not None or self.store_url is not None) and not self.prefix_cache:
            raise DsakvError("host_bytes / store_url: the lower tiers hold prefix-cache pages; set prefix_cache=True")
        if self.kv_events_endpoint is not None:
            check_endpoint("kv_events_endpoint", self.kv_events_endpoint)
            if not self.prefix_cache:
                raise DsakvError("kv_events_endpoint: needs prefix_cache=True (the radix cache is what emits events)")
        if not isinstance(self.kv_events_topic, str):
            raise DsakvError(f"kv_events_topic = {self.kv_events_topic!r}: must be a string (a SUB socket's prefix)")
        if self.kv_events_replay_endpoint is not None:
            check_endpoint("kv_events_replay_endpoint", self.kv_events_replay_endpoint)
            if self.kv_events_endpoint is None:
                raise DsakvError("kv_events_replay_endpoint: needs kv_events_endpoint (replay serves what PUB sent)")
        if not isinstance(self.metrics, bool):
            raise DsakvError(f"metrics = {self.metrics!r}: must be True or False")
        self._check_speculative()

    def _check_speculative(self) -> None:
        share = self.index_share_for_mtp_iteration
        if not isinstance(share, bool):
            raise DsakvError(f"index_share_for_mtp_iteration = {share!r}: must be True or False")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DsakvError(f"num_speculative_tokens = {k!r}: must be an integer >= 0 (the draft chain length)")
        if self.speculative is None:
            unset = {"num_speculative_tokens": 0, "eagle_topk": 1, "index_share_for_mtp_iteration": False}
            for name, default in unset.items():
                if getattr(self, name) != default:
                    raise DsakvError(f"{name} = {getattr(self, name)!r}: needs speculative = 'mtp'")
            return
        check_choice("speculative", self.speculative, SPECULATIVE_ALGORITHMS)
        if self.eagle_topk != 1 or isinstance(self.eagle_topk, bool):
            raise DsakvError(f"eagle_topk = {self.eagle_topk!r}: must be 1 (chains; tree drafts are not built)")
        if self.scheduler.num_speculative_tokens not in (0, k):
            raise DsakvError(
                f"scheduler.num_speculative_tokens = {self.scheduler.num_speculative_tokens}: with speculative = "
                f"'mtp' the engine sets it to num_speculative_tokens = {k} (leave it 0)"
            )
        if self.scheduler.max_batched_tokens < 1 + k:
            raise DsakvError(
                f"scheduler.max_batched_tokens = {self.scheduler.max_batched_tokens}: must be >= 1 + "
                f"num_speculative_tokens ({1 + k})"
            )

    @property
    def mtp_layers(self) -> int:
        """MTP cache layers the pool holds: 1 with speculative = 'mtp' (the first MTP layer drafts), else 0."""
        return 0 if self.speculative is None else 1

    @property
    def padding_slots(self) -> int:
        """Scratch slots the padding rows of one forward occupy at most (``SCRATCH_SEQS`` x ``min_rows``)."""
        return SCRATCH_SEQS * self.min_rows
