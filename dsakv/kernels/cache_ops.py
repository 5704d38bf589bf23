"""Quantize-and-store and gather-and-dequantize for both caches: plain-torch references and dispatchers.

The Triton variants (same signatures) sit in ``dsakv.kernels.cache_ops_triton``; what both share (the fp8
dtype, the last-writer rule) sits in ``dsakv.kernels.common``. ``store_main`` / ``gather_main`` /
``store_indexer`` / ``gather_indexer`` pick Triton on CUDA (or with ``DSAKV_KERNELS=triton``).

Every function takes per-layer *views* of the pool (``TwinPool.main_view`` / ``indexer_view``), so the
``slot`` and ``packed`` layouts differ only in strides, never in kernel code:

* ``main``  uint8 ``[pages, page_size, row_bytes]``;
* ``index`` uint8 ``[pages, states_per_page * 132]`` (keys then scales, see ``dsakv.spec.layout``).

A token slot is ``page * page_size + offset``. Inputs are assumed validated by the pool (slots in range,
no duplicate main slots); these functions do not check.

Quantization (``kv_dtype="fp8_ds_mla"``)::

    latent[512] -> 4 tiles of 128: scale_i = amax(|tile_i|) / 448, q = fp8_e4m3(tile_i / scale_i)
    row = | q (512 x fp8) | scale_0..3 (4 x fp32) | rope (64 x bf16) |        little-endian, 656 B

An all-zero tile gets scale 1.0 (not 0, which would make ``0 / 0``); its fp8 bytes are then zero and it
dequantizes to exact zeros. The indexer key uses the same rule with one scale per 128-value key.
``bf16`` stores latent and RoPE as bf16; ``fp8`` stores both as fp8 divided by one per-layer scale
(``fp8_scale``, default 1.0), values beyond ``448 * fp8_scale`` saturating.

``index_kpool = N > 1``: token offset ``o`` maps to indexer state ``o // N``. A state holds the key of the
*most recently stored* token of its group: within one call the last token (in slot order) of a group
wins, and a later call overwrites. Stored in order, a complete group therefore holds its last token's key.
"""

from __future__ import annotations

import torch

from dsakv.kernels import use_triton
from dsakv.kernels.common import FP8, last_per_key
from dsakv.spec.layout import FP8_E4M3_MAX, INDEXER_SCALE_BYTES, QUANT_TILE

__all__ = [
    "decode_main_rows",
    "encode_main_rows",
    "gather_indexer",
    "gather_indexer_torch",
    "gather_main",
    "gather_main_torch",
    "indexer_columns",
    "quantize_tiles",
    "slot_states",
    "store_indexer",
    "store_indexer_torch",
    "store_main",
    "store_main_torch",
]


def quantize_tiles(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [n, d]`` -> (fp8 ``[n, d]``, fp32 scales ``[n, d // tile]``); scale = amax / 448, zero tile -> 1.0."""
    n, d = x.shape
    t = x.float().reshape(n, d // tile, tile)
    amax = t.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (t / scale.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8)
    return q.reshape(n, d), scale


def _split_slots(slots: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.div(slots, page_size, rounding_mode="floor"), slots % page_size


# ----- main KV ---------------------------------------------------------------------------------------
def encode_main_rows(latent: torch.Tensor, rope: torch.Tensor, kv_dtype: str, fp8_scale: float = 1.0) -> torch.Tensor:
    """Quantize ``latent [n, r]`` and ``rope [n, p]`` into uint8 rows ``[n, row_bytes]``."""
    n = latent.shape[0]
    if kv_dtype == "fp8_ds_mla":
        q, scale = quantize_tiles(latent, QUANT_TILE)
        parts = [
            q.view(torch.uint8),
            scale.contiguous().view(torch.uint8),
            rope.to(torch.bfloat16).contiguous().view(torch.uint8),
        ]
    elif kv_dtype == "bf16":
        parts = [t.to(torch.bfloat16).contiguous().view(torch.uint8) for t in (latent, rope)]
    elif kv_dtype == "fp8":
        both = torch.cat([latent.float(), rope.float()], dim=1) / fp8_scale
        parts = [both.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8).view(torch.uint8)]
    elif kv_dtype == "fp32":
        parts = [t.to(torch.float32).contiguous().view(torch.uint8) for t in (latent, rope)]
    else:
        raise ValueError(f"kv_dtype {kv_dtype!r}")
    return torch.cat([p.reshape(n, -1) for p in parts], dim=1)


def decode_main_rows(
    rows: torch.Tensor, kv_dtype: str, kv_lora_rank: int, rope_dim: int, fp8_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 rows ``[n, row_bytes]`` -> (latent fp32 ``[n, r]``, rope fp32 ``[n, p]``)."""
    n = rows.shape[0]
    rows = rows.contiguous()
    r = kv_lora_rank
    if kv_dtype == "fp8_ds_mla":
        tiles = r // QUANT_TILE
        q = rows[:, :r].contiguous().view(FP8).float().reshape(n, tiles, QUANT_TILE)
        scale = rows[:, r : r + 4 * tiles].contiguous().view(torch.float32)
        latent = (q * scale.unsqueeze(-1)).reshape(n, r)
        rope = rows[:, r + 4 * tiles :].contiguous().view(torch.bfloat16).float()
    elif kv_dtype == "bf16":
        both = rows.view(torch.bfloat16).float()
        latent, rope = both[:, :r], both[:, r:]
    elif kv_dtype == "fp8":
        both = rows.view(FP8).float() * fp8_scale
        latent, rope = both[:, :r], both[:, r:]
    elif kv_dtype == "fp32":
        both = rows.view(torch.float32)
        latent, rope = both[:, :r], both[:, r:]
    else:
        raise ValueError(f"kv_dtype {kv_dtype!r}")
    return latent.reshape(n, r), rope.reshape(n, rope_dim)


def store_main_torch(
    main: torch.Tensor,
    slots: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    kv_dtype: str,
    fp8_scale: float = 1.0,
) -> None:
    """Quantize and write one main-KV row per slot into ``main [pages, page_size, row]`` (in place)."""
    rows = encode_main_rows(latent, rope, kv_dtype, fp8_scale)
    if main.is_contiguous():  # slot layout: slot == row index; index_copy_ is much faster than index_put
        main.view(-1, main.shape[2]).index_copy_(0, slots, rows)
    else:
        page, off = _split_slots(slots, main.shape[1])
        main[page, off] = rows


def gather_main_torch(
    main: torch.Tensor, slots: torch.Tensor, kv_dtype: str, kv_lora_rank: int, rope_dim: int, fp8_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read and dequantize the rows of ``slots``; does not modify the pool."""
    if main.is_contiguous():
        rows = main.view(-1, main.shape[2]).index_select(0, slots)
    else:
        page, off = _split_slots(slots, main.shape[1])
        rows = main[page, off]
    return decode_main_rows(rows, kv_dtype, kv_lora_rank, rope_dim, fp8_scale)


# ----- indexer K -------------------------------------------------------------------------------------
def indexer_columns(states: torch.Tensor, states_per_page: int, key_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte columns of each state's key ``[n, key_dim]`` and scale ``[n, 4]`` inside an indexer page.

    ::

        | key 0 | key 1 | ... | key S-1 | scale 0 | ... | scale S-1 |     S = states_per_page
        state s: key at s * key_dim, scale at S * key_dim + 4 * s
    """
    key_cols = states.unsqueeze(1) * key_dim + torch.arange(key_dim, device=states.device)
    scale_base = states_per_page * key_dim + INDEXER_SCALE_BYTES * states
    scale_cols = scale_base.unsqueeze(1) + torch.arange(INDEXER_SCALE_BYTES, device=states.device)
    return key_cols, scale_cols


def slot_states(slots: torch.Tensor, page_size: int, kpool: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, state within the page) of each slot: state = offset // kpool."""
    page, off = _split_slots(slots, page_size)
    return page, torch.div(off, kpool, rounding_mode="floor")


def store_indexer_torch(
    index: torch.Tensor,
    slots: torch.Tensor,
    key: torch.Tensor,
    page_size: int,
    kpool: int = 1,
    key_dtype: torch.dtype = FP8,
) -> None:
    """Quantize each key to fp8 with one fp32 scale and write key and scale bytes (in place).

    ``key_dtype=torch.float32`` (the exact mode) stores the key unrounded with scale 1.0."""
    states_per_page = page_size // kpool
    page, state = slot_states(slots, page_size, kpool)
    if kpool > 1:
        keep = last_per_key(page * states_per_page + state)
        page, state, key = page[keep], state[keep], key[keep]
    if key_dtype == torch.float32:
        q, scale = key.float().contiguous(), torch.ones(key.shape[0], 1)
    else:
        q, scale = quantize_tiles(key, key.shape[1])
    key_bytes = key.shape[1] * q.element_size()
    key_cols, scale_cols = indexer_columns(state, states_per_page, key_bytes)
    rows = page.unsqueeze(1)
    index[rows, key_cols] = q.view(torch.uint8)
    index[rows, scale_cols] = scale.contiguous().view(torch.uint8)


def gather_indexer_torch(
    index: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    key_dim: int,
    kpool: int = 1,
    key_dtype: torch.dtype = FP8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw keys ``[n, key_dim]`` (fp8, or fp32 in the exact mode) and fp32 scales ``[n]`` of ``slots``; does
    not modify the pool."""
    page, state = slot_states(slots, page_size, kpool)
    key_cols, scale_cols = indexer_columns(state, page_size // kpool, key_dim * key_dtype.itemsize)
    rows = page.unsqueeze(1)
    key = index[rows, key_cols].contiguous().view(key_dtype)
    scale = index[rows, scale_cols].contiguous().view(torch.float32).reshape(-1)
    return key, scale


# ----- dispatch --------------------------------------------------------------------------------------
# Triton is an optional extra: its wrappers are imported where they are picked, not at module import.
def store_main(
    main: torch.Tensor,
    slots: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    kv_dtype: str,
    fp8_scale: float = 1.0,
) -> None:
    """Dispatcher of :func:`store_main_torch` / ``cache_ops_triton.store_main_triton`` (fp32: torch only)."""
    if use_triton(main.device) and kv_dtype != "fp32":
        from dsakv.kernels.cache_ops_triton import store_main_triton

        store_main_triton(main, slots, latent, rope, kv_dtype, fp8_scale)
    else:
        store_main_torch(main, slots, latent, rope, kv_dtype, fp8_scale)


def gather_main(
    main: torch.Tensor, slots: torch.Tensor, kv_dtype: str, kv_lora_rank: int, rope_dim: int, fp8_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatcher of :func:`gather_main_torch` / ``cache_ops_triton.gather_main_triton`` (fp32: torch only)."""
    if use_triton(main.device) and kv_dtype != "fp32":
        from dsakv.kernels.cache_ops_triton import gather_main_triton

        return gather_main_triton(main, slots, kv_dtype, kv_lora_rank, rope_dim, fp8_scale)
    return gather_main_torch(main, slots, kv_dtype, kv_lora_rank, rope_dim, fp8_scale)


def store_indexer(
    index: torch.Tensor,
    slots: torch.Tensor,
    key: torch.Tensor,
    page_size: int,
    kpool: int = 1,
    key_dtype: torch.dtype = FP8,
) -> None:
    """Dispatcher of :func:`store_indexer_torch` / ``cache_ops_triton.store_indexer_triton`` (fp32 keys: torch)."""
    if use_triton(index.device) and key_dtype == FP8:
        from dsakv.kernels.cache_ops_triton import store_indexer_triton

        store_indexer_triton(index, slots, key, page_size, kpool)
    else:
        store_indexer_torch(index, slots, key, page_size, kpool, key_dtype)


def gather_indexer(
    index: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    key_dim: int,
    kpool: int = 1,
    key_dtype: torch.dtype = FP8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatcher of :func:`gather_indexer_torch` / ``cache_ops_triton.gather_indexer_triton`` (fp32 keys: torch)."""
    if use_triton(index.device) and key_dtype == FP8:
        from dsakv.kernels.cache_ops_triton import gather_indexer_triton

        return gather_indexer_triton(index, slots, page_size, key_dim, kpool)
    return gather_indexer_torch(index, slots, page_size, key_dim, kpool, key_dtype)
