"""Byte layouts of the two caches: one main-KV row per token per attention layer, one indexer-K
entry per token per full indexer layer, both under one page id.

Main-KV row formats (``kv_dtype``), per token per layer::

    fp8_ds_mla  | 512 x fp8 latent | 4 x fp32 tile scales | 64 x bf16 RoPE |  = 512 + 16 + 128 = 656 B
    bf16        | 512 x bf16 latent               | 64 x bf16 RoPE |         = 1024 + 128     = 1152 B
    fp8         | 512 x fp8 latent                | 64 x fp8 RoPE  |         = 512 + 64       = 576 B
    fp32        | 512 x fp32 latent               | 64 x fp32 RoPE |         = 2048 + 256     = 2304 B

``fp32`` main KV with ``indexer_dtype="fp32"`` (key stored as fp32, scale 1.0) is the *exact* cache mode: no
rounding anywhere, so the paged model reproduces transformers' greedy tokens (a CPU reference mode; the CUDA
kernels serve fp8_ds_mla and an fp8 indexer).

Indexer page of one full layer (page_size = 64, ``index_kpool`` = 1)::

    | key 0 | key 1 | ... | key 63 | scale 0 | ... | scale 63 |
    0       128     256     8064    8192      8196    8444     8448
    token t: key bytes at t*128, fp32 scale at 64*128 + 4*t

A per-token move must therefore move two byte ranges per indexer entry (key and scale); copying
whole 132-byte spans from ``t*132`` would read neighbours' keys.

``index_kpool = N`` keeps one indexer state per N tokens. The main page stays ``page_size`` tokens
and the indexer region of each page id holds ``page_size // N`` states (keys then scales), so one
page id still names both caches and allocation, eviction, move and offload stay per page id. The CUDA rule
is on that *physical* indexer page: ``page_size // index_kpool`` must be 64 (main page 128 with kpool 2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from dsakv.errors import DsakvError, check_choice
from dsakv.spec.model_spec import ModelSpec, check_layer_count

CUDA_PAGE_SIZE = 64  # the DSA indexer kernels on CUDA read 64-token pages
FP8_E4M3_MAX = 448.0
QUANT_TILE = 128  # fp8_ds_mla: one fp32 scale per 128 latent values
INDEXER_SCALE_BYTES = 4  # one fp32 scale per indexer key


@dataclass(frozen=True)
class MainKVFormat:
    """How one token's main-KV row is stored. Byte counts are per value."""

    name: str
    latent_value_bytes: int
    rope_value_bytes: int
    scale_tile: int  # latent values per fp32 scale; 0 = no per-token scales
    description: str

    def latent_bytes(self, kv_lora_rank: int) -> int:
        return kv_lora_rank * self.latent_value_bytes

    def scale_bytes(self, kv_lora_rank: int) -> int:
        return 0 if self.scale_tile == 0 else (kv_lora_rank // self.scale_tile) * 4

    def rope_bytes(self, rope_dim: int) -> int:
        return rope_dim * self.rope_value_bytes

    def row_bytes(self, kv_lora_rank: int, rope_dim: int) -> int:
        return self.latent_bytes(kv_lora_rank) + self.scale_bytes(kv_lora_rank) + self.rope_bytes(rope_dim)


KV_DTYPES: dict[str, MainKVFormat] = {
    "fp8_ds_mla": MainKVFormat("fp8_ds_mla", 1, 2, QUANT_TILE, "fp8 latent, fp32 scale per 128 values, bf16 RoPE"),
    "bf16": MainKVFormat("bf16", 2, 2, 0, "bf16 latent and RoPE"),
    "fp8": MainKVFormat("fp8", 1, 1, 0, "all 576 dims fp8, per-tensor scale"),
    "fp32": MainKVFormat("fp32", 4, 4, 0, "fp32 latent and RoPE (exact mode, CPU)"),
}
INDEXER_DTYPES = {"fp8": 1, "fp32": 4}  # bytes per indexer key value; every state also has one fp32 scale


def kv_format(name: str) -> MainKVFormat:
    check_choice("kv_dtype", name, KV_DTYPES)
    return KV_DTYPES[name]


@dataclass(frozen=True)
class CacheLayout:
    """Bytes of each cache per token, per page and per page id, for one spec and storage choice.

    ``mtp_layers`` adds draft/MTP cache layers; each prices a main row and a full indexer entry.
    Set ``allow_any_page_size`` ("not for CUDA kernels") to use an indexer physical page (``page_size //
    index_kpool``) other than 64.
    The layout is immutable, so the figures the simulator's step-time model reads every step (row, page and
    cell bytes, the indexer layers) are computed once per layout (``cached_property``).
    """

    spec: ModelSpec
    kv_dtype: str = "fp8_ds_mla"
    page_size: int = CUDA_PAGE_SIZE
    index_kpool: int = 1
    mtp_layers: int = 0
    allow_any_page_size: bool = False
    indexer_dtype: str = "fp8"

    def __post_init__(self) -> None:
        fmt = kv_format(self.kv_dtype)
        check_choice("indexer_dtype", self.indexer_dtype, INDEXER_DTYPES)
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise DsakvError(f"page_size = {self.page_size!r}: must be a positive integer (64 for CUDA kernels)")
        if not isinstance(self.index_kpool, int) or self.index_kpool < 1 or self.page_size % self.index_kpool:
            raise DsakvError(
                f"index_kpool = {self.index_kpool!r}: must be a positive divisor of page_size = {self.page_size}"
            )
        physical = self.page_size // self.index_kpool
        if physical != CUDA_PAGE_SIZE and not self.allow_any_page_size:
            raise DsakvError(
                f"page_size = {self.page_size}, index_kpool = {self.index_kpool}: the indexer's physical page is "
                f"page_size // index_kpool = {physical} tokens; the DSA indexer kernels on CUDA read "
                f"{CUDA_PAGE_SIZE}-token pages (page_size = {CUDA_PAGE_SIZE} x index_kpool); other sizes need the "
                "explicit 'not for CUDA kernels' option (--allow-non-cuda-page-size)"
            )
        check_layer_count("mtp_layers", self.mtp_layers, 0)
        if fmt.scale_tile and self.spec.kv_lora_rank % fmt.scale_tile:
            raise DsakvError(
                f"kv_lora_rank = {self.spec.kv_lora_rank}: kv_dtype {self.kv_dtype!r} needs a multiple of {fmt.scale_tile}"
            )

    # ----- per-token rows ------------------------------------------------------------------------
    @property
    def main_format(self) -> MainKVFormat:
        return KV_DTYPES[self.kv_dtype]

    @property
    def main_latent_bytes(self) -> int:
        return self.main_format.latent_bytes(self.spec.kv_lora_rank)

    @property
    def main_scale_bytes(self) -> int:
        return self.main_format.scale_bytes(self.spec.kv_lora_rank)

    @property
    def main_rope_bytes(self) -> int:
        return self.main_format.rope_bytes(self.spec.qk_rope_head_dim)

    @cached_property
    def main_row_bytes(self) -> int:
        """Bytes of one token in one attention layer (656 for fp8_ds_mla)."""
        return self.main_latent_bytes + self.main_scale_bytes + self.main_rope_bytes

    @property
    def indexer_key_bytes(self) -> int:
        return self.spec.index_head_dim * INDEXER_DTYPES[self.indexer_dtype]  # fp8: one byte per dim

    @property
    def indexer_row_bytes(self) -> int:
        """Bytes of one indexer state in one full layer: fp8 key + fp32 scale (132; 516 for an fp32 key)."""
        return self.indexer_key_bytes + INDEXER_SCALE_BYTES

    # ----- layers --------------------------------------------------------------------------------
    @property
    def num_attention_layers(self) -> int:
        """Cache layers holding main KV: decoder layers plus MTP/draft layers."""
        return self.spec.num_hidden_layers + self.mtp_layers

    @cached_property
    def indexer_layers(self) -> tuple[int, ...]:
        """Cache layer ids holding indexer K: the spec's full layers, then every MTP layer."""
        n = self.spec.num_hidden_layers
        return self.spec.full_indexer_layers + tuple(range(n, n + self.mtp_layers))

    @property
    def num_indexer_layers(self) -> int:
        return len(self.indexer_layers)

    def layer_has_indexer(self, layer: int) -> bool:
        if layer >= self.spec.num_hidden_layers:
            return layer < self.num_attention_layers
        return self.spec.indexer_types[layer] == "full"

    # ----- pages -----------------------------------------------------------------------------------
    @property
    def indexer_states_per_page(self) -> int:
        return self.page_size // self.index_kpool

    @property
    def indexer_physical_page(self) -> int:
        """Tokens' states in one physical indexer page, ``page_size // index_kpool``: 64 on CUDA (SGLang asserts
        the physical page is 64, so main page 128 with kpool 2 is legal and main 64 with kpool 2 is not)."""
        return self.page_size // self.index_kpool

    @property
    def indexer_kernel_block(self) -> int:
        """Tokens one block of vLLM's indexer kernel spans: ``index_kpool x`` the physical page (its
        ``tokens_per_state = index_kpool``); equal to ``page_size``, so one page id stays one block."""
        return self.index_kpool * self.indexer_physical_page

    @property
    def indexer_scale_offset(self) -> int:
        """Byte offset of the scale area inside one indexer page (8,192 for 64 x 128 B keys)."""
        return self.indexer_states_per_page * self.indexer_key_bytes

    def indexer_key_offset(self, state: int) -> int:
        return state * self.indexer_key_bytes

    def indexer_scale_offset_of(self, state: int) -> int:
        return self.indexer_scale_offset + state * INDEXER_SCALE_BYTES

    @property
    def main_page_bytes_per_layer(self) -> int:
        return self.page_size * self.main_row_bytes

    @property
    def indexer_page_bytes_per_layer(self) -> int:
        """One indexer page of one full layer: keys then scales (8,448 B at 64 states)."""
        return self.indexer_states_per_page * self.indexer_row_bytes

    @property
    def main_page_bytes(self) -> int:
        """Main-KV bytes of one page id over all attention layers."""
        return self.main_page_bytes_per_layer * self.num_attention_layers

    @property
    def indexer_page_bytes(self) -> int:
        """Indexer-K bytes of one page id over all indexer layers."""
        return self.indexer_page_bytes_per_layer * self.num_indexer_layers

    @cached_property
    def page_bytes(self) -> int:
        """Bytes of one page id in both caches; also the block size of the ``packed`` layout."""
        return self.main_page_bytes + self.indexer_page_bytes

    def packed_main_offset(self, layer: int) -> int:
        """Byte offset of a layer's main page inside a ``packed`` block."""
        return layer * self.main_page_bytes_per_layer

    def packed_indexer_offset(self, layer: int) -> int:
        """Byte offset of a full layer's indexer page inside a ``packed`` block."""
        j = self.indexer_layers.index(layer)
        return self.main_page_bytes + j * self.indexer_page_bytes_per_layer

    # ----- per token -------------------------------------------------------------------------------
    @property
    def main_bytes_per_token(self) -> int:
        return self.main_row_bytes * self.num_attention_layers

    @property
    def indexer_bytes_per_token(self) -> float | int:
        """132 x indexer layers / kpool (an int unless kpool leaves a fraction)."""
        return exact_div(self.indexer_page_bytes, self.page_size)

    @cached_property
    def cell_bytes(self) -> float | int:
        """Bytes one token costs in both caches (53,940 for GLM-5.3 fp8_ds_mla)."""
        return exact_div(self.page_bytes, self.page_size)

    def with_index_kpool(self, index_kpool: int) -> CacheLayout:
        """This layout with ``index_kpool`` states merged per indexer state and the *physical* indexer page kept:
        ``page_size = indexer_physical_page x index_kpool`` (64 -> 128 at kpool 2), the what-if the CUDA rule allows.
        """
        return replace(self, index_kpool=index_kpool, page_size=self.indexer_physical_page * index_kpool)

    def pages_for_tokens(self, tokens: int) -> int:
        return ceil_div(tokens, self.page_size)

    def to_dict(self) -> dict:
        return {
            "kv_dtype": self.kv_dtype,
            "page_size": self.page_size,
            "index_kpool": self.index_kpool,
            "mtp_layers": self.mtp_layers,
            "attention_layers": self.num_attention_layers,
            "indexer_layers": self.num_indexer_layers,
            "main_row_bytes": self.main_row_bytes,
            "indexer_row_bytes": self.indexer_row_bytes,
            "main_bytes_per_token": self.main_bytes_per_token,
            "indexer_bytes_per_token": self.indexer_bytes_per_token,
            "cell_bytes": self.cell_bytes,
            "main_page_bytes": self.main_page_bytes,
            "indexer_page_bytes": self.indexer_page_bytes,
            "page_bytes": self.page_bytes,
        }


def exact_div(num: int, den: int) -> float | int:
    """``num / den`` as an int when it divides exactly (byte counts stay integers), else a float."""
    return num // den if num % den == 0 else num / den


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "CUDA_PAGE_SIZE",
    "FP8_E4M3_MAX",
    "QUANT_TILE",
    "INDEXER_DTYPES",
    "KV_DTYPES",
    "MainKVFormat",
    "CacheLayout",
    "kv_format",
    "ceil_div",
    "exact_div",
]
