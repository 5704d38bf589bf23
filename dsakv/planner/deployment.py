"""A deployment and where one rank's memory goes: ``GpuSetting`` (device memory, TP / DP-attention /
DCP, ``mem_fraction_static``, weights, activation reserve) and ``rank_memory`` (the bytes left for the
pool). Frozen and validated at construction; pure functions, nothing allocated. Formulas: docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dsakv.errors import DsakvError, check_choice
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.weights import MOE_A2A, weights_per_rank
from dsakv.planner.workspaces import topk_buffer_bytes
from dsakv.spec.layout import CacheLayout

GIB = 2**30
DEFAULT_MEM_FRACTION = 0.85
# CUDA context, NCCL/communicator buffers and the CUDA-graph pool that land inside the static
# fraction; activations proper live in the (1 - mem_fraction_static) remainder.
DEFAULT_ACTIVATION_BYTES = 2 * GIB
DEFAULT_MAX_BATCHED_TOKENS = 2048


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DsakvError(f"{name} = {value!r}: must be an integer >= {minimum}")


@dataclass(frozen=True)
class GpuSetting:
    """A deployment: device memory, parallelism and the engine's memory knobs (validated)."""

    gpu: str = "H200"
    gpu_memory_bytes: int | None = None  # overrides the GPU kind's memory
    num_gpus: int = 8
    tp: int | None = None  # default: num_gpus
    dp_attention: int = 1
    dcp: int = 1
    mem_fraction_static: float = DEFAULT_MEM_FRACTION
    weights_bytes: int | None = None  # per rank; None = computed from the config
    weight_dtype: str | None = None  # None = the config's
    activation_bytes: int = DEFAULT_ACTIVATION_BYTES
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    moe_a2a: str = "none"  # the MoE's token exchange (MOE_A2A): under ``deepep`` every rank holds whole shared experts

    def __post_init__(self) -> None:
        if self.gpu_memory_bytes is not None:
            if isinstance(self.gpu_memory_bytes, bool) or not isinstance(self.gpu_memory_bytes, int):
                raise DsakvError(f"gpu memory = {self.gpu_memory_bytes!r}: must be a positive integer of bytes")
            if self.gpu_memory_bytes <= 0:
                raise DsakvError(f"gpu memory = {self.gpu_memory_bytes}: must be a positive number of bytes")
        else:
            gpu_kind(self.gpu)
        check_int("num_gpus", self.num_gpus, 1)
        tp = self.tensor_parallel
        check_int("tp", tp, 1)
        if self.num_gpus % tp:
            raise DsakvError(f"tp = {tp}: must divide num_gpus = {self.num_gpus}")
        check_int("dp_attention", self.dp_attention, 1)
        if tp % self.dp_attention:
            raise DsakvError(f"dp_attention = {self.dp_attention}: must divide tp = {tp}")
        check_int("dcp", self.dcp, 1)
        if (tp // self.dp_attention) % self.dcp:
            raise DsakvError(
                f"dcp = {self.dcp}: must divide the attention TP size tp/dp_attention = {tp // self.dp_attention}"
            )
        f = self.mem_fraction_static
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise DsakvError(f"mem_fraction_static = {f!r}: must be in (0, 1]")
        if self.weights_bytes is not None:
            check_int("weights bytes", self.weights_bytes, 0)
        check_int("activation bytes", self.activation_bytes, 0)
        check_int("max_batched_tokens", self.max_batched_tokens, 1)
        check_choice("moe_a2a", self.moe_a2a, MOE_A2A)

    @property
    def tensor_parallel(self) -> int:
        return self.num_gpus if self.tp is None else self.tp

    @property
    def total_bytes(self) -> int:
        """Device memory of one rank as the driver reports it."""
        return self.gpu_memory_bytes if self.gpu_memory_bytes is not None else gpu_kind(self.gpu).memory_bytes

    @property
    def pools(self) -> int:
        """Independent KV pools in the deployment: TP replicas x attention-DP groups."""
        return (self.num_gpus // self.tensor_parallel) * self.dp_attention

    def to_dict(self) -> dict:
        return {
            "gpu": None if self.gpu_memory_bytes is not None else gpu_kind(self.gpu).name,
            "gpu_memory_bytes": self.total_bytes,
            "num_gpus": self.num_gpus,
            "tp": self.tensor_parallel,
            "dp_attention": self.dp_attention,
            "dcp": self.dcp,
            "mem_fraction_static": self.mem_fraction_static,
            "max_batched_tokens": self.max_batched_tokens,
            "moe_a2a": self.moe_a2a,
        }


@dataclass(frozen=True)
class RankMemory:
    """Where one rank's memory goes; ``available_bytes`` (possibly negative) is left for the pool."""

    total_bytes: int
    static_bytes: int
    weights_bytes: int
    weights_computed: bool
    activation_bytes: int
    topk_buffer_bytes: int
    available_bytes: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def rank_memory(layout: CacheLayout, setting: GpuSetting) -> RankMemory:
    """Split one rank's memory: static fraction minus weights, activation reserve and top-k buffer."""
    total = setting.total_bytes
    static = int(total * Fraction(str(setting.mem_fraction_static)))
    computed = setting.weights_bytes is None
    if computed:
        weights = weights_per_rank(
            layout.spec,
            tp=setting.tensor_parallel,
            dp_attention=setting.dp_attention,
            mtp_layers=layout.mtp_layers,
            dtype=setting.weight_dtype,
            moe_a2a=setting.moe_a2a,
        ).rank_bytes
    else:
        weights = setting.weights_bytes
    topk = topk_buffer_bytes(setting.max_batched_tokens, layout.spec.index_topk)
    available = static - weights - setting.activation_bytes - topk
    return RankMemory(total, static, weights, computed, setting.activation_bytes, topk, available)


__all__ = [
    "DEFAULT_ACTIVATION_BYTES",
    "DEFAULT_MAX_BATCHED_TOKENS",
    "DEFAULT_MEM_FRACTION",
    "GpuSetting",
    "RankMemory",
    "rank_memory",
]
