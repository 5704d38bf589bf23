"""Triton variants of ``dsakv.kernels.cache_ops`` (same signatures; picked on CUDA by the dispatcher).

One program per token slot. The kernels address the pool through typed views of the same uint8 memory
(``main.view(float32)`` for the tile scales, ``view(bfloat16)`` for RoPE, ``view(float8_e4m3fn)`` for fp8
bytes), so byte offsets are divided by the element size; every component offset of every row is a multiple
of its element size, which the layout guarantees (656-byte rows, 8448-byte indexer pages, 4-byte scales).

Dataflow of the main-KV store (``fp8_ds_mla``)::

    slot -> page = slot // PS, off = slot % PS, row = page * stride_page + off * stride_row   (bytes, int64)
    latent[TILES, 128] -> amax per tile -> scale = amax / 448 (0 -> 1) -> e4m3(latent / scale) at row + 0
    scale[TILES] fp32 at row + R;  rope[P] -> bf16 at row + R + 4 * TILES

fp8 rounding is done explicitly (round-to-nearest-even onto the e4m3 grid in fp32, then an exact cast), so
the stored bytes equal the torch reference's on any backend; the Triton CPU interpreter's own fp32 -> fp8
cast drops the carry when rounding up across a power of two (31.5 -> 16 instead of 32). The e4m3 maximum
448 (``layout.FP8_E4M3_MAX``) is inlined: jit code cannot read float globals. Key and tile widths are
powers of two (128), as ``tl.arange`` needs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsakv.kernels.common import FP8, last_per_key
from dsakv.spec.layout import QUANT_TILE

_KV_CODE = {"fp8_ds_mla": 0, "bf16": 1, "fp8": 2}


@triton.jit
def _round_e4m3(v):
    """Round fp32 ``v`` (|v| <= 448) to the nearest e4m3 value (ties to even), still as fp32."""
    bits = v.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF  # biased fp32 exponent
    exp = tl.maximum(exp, 127 - 6)  # e4m3 subnormals share the step of the smallest normal binade
    step = ((exp - 3) << 23).to(tl.float32, bitcast=True)  # 2**(e - 3): 3 mantissa bits
    magic = 12582912.0  # 1.5 * 2**23: adding and subtracting rounds to an integer, ties to even
    r = ((tl.abs(v) / step + magic) - magic) * step
    return tl.where(bits < 0, -r, r)  # keep the sign of values that round to zero (-0.0, as torch does)


@triton.jit
def _round_bf16(v):
    """Round fp32 ``v`` to the nearest bf16 value (ties to even), still as fp32, so the cast is exact."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # keep the top 16 bits, rounded
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store_main_kernel(
    main_u8, main_f8, main_f32, main_bf16, slots_ptr, latent_ptr, rope_ptr,
    stride_page, stride_row, fp8_scale,
    PS: tl.constexpr, R: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, TILES: tl.constexpr,
    BLOCK_P: tl.constexpr, KV: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i)
    row = (slot // PS) * stride_page + (slot % PS) * stride_row  # byte offset of this token's row (int64)
    cols = tl.arange(0, TILES)[:, None] * TILE + tl.arange(0, TILE)[None, :]  # [TILES, TILE]
    x = tl.load(latent_ptr + i * R + cols).to(tl.float32)
    p = tl.arange(0, BLOCK_P)
    pm = p < P
    rope = tl.load(rope_ptr + i * P + p, mask=pm, other=0.0).to(tl.float32)
    if KV == 0:  # fp8_ds_mla: | fp8 latent | TILES fp32 scales | bf16 rope |
        amax = tl.max(tl.abs(x), axis=1)  # [TILES]
        scale = tl.where(amax > 0, amax / 448.0, 1.0)
        q = _round_e4m3(tl.clamp(x / scale[:, None], -448.0, 448.0))
        tl.store(main_f8 + row + cols, q.to(tl.float8e4nv))
        tl.store(main_f32 + (row + R) // 4 + tl.arange(0, TILES), scale)
        tl.store(main_bf16 + (row + R + 4 * TILES) // 2 + p, _round_bf16(rope).to(tl.bfloat16), mask=pm)
    elif KV == 1:  # bf16: | bf16 latent | bf16 rope |
        tl.store(main_bf16 + row // 2 + cols, _round_bf16(x).to(tl.bfloat16))
        tl.store(main_bf16 + row // 2 + R + p, _round_bf16(rope).to(tl.bfloat16), mask=pm)
    else:  # fp8: | fp8 latent | fp8 rope |, one per-layer scale
        q = _round_e4m3(tl.clamp(x / fp8_scale, -448.0, 448.0))
        tl.store(main_f8 + row + cols, q.to(tl.float8e4nv))
        qr = _round_e4m3(tl.clamp(rope / fp8_scale, -448.0, 448.0))
        tl.store(main_f8 + row + R + p, qr.to(tl.float8e4nv), mask=pm)


@triton.jit
def _gather_main_kernel(
    main_u8, main_f8, main_f32, main_bf16, slots_ptr, latent_out, rope_out,
    stride_page, stride_row, fp8_scale,
    PS: tl.constexpr, R: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, TILES: tl.constexpr,
    BLOCK_P: tl.constexpr, KV: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i)
    row = (slot // PS) * stride_page + (slot % PS) * stride_row
    cols = tl.arange(0, TILES)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    p = tl.arange(0, BLOCK_P)
    pm = p < P
    if KV == 0:
        scale = tl.load(main_f32 + (row + R) // 4 + tl.arange(0, TILES))
        x = tl.load(main_f8 + row + cols).to(tl.float32) * scale[:, None]
        rope = tl.load(main_bf16 + (row + R + 4 * TILES) // 2 + p, mask=pm).to(tl.float32)
    elif KV == 1:
        x = tl.load(main_bf16 + row // 2 + cols).to(tl.float32)
        rope = tl.load(main_bf16 + row // 2 + R + p, mask=pm).to(tl.float32)
    else:
        x = tl.load(main_f8 + row + cols).to(tl.float32) * fp8_scale
        rope = tl.load(main_f8 + row + R + p, mask=pm).to(tl.float32) * fp8_scale
    tl.store(latent_out + i * R + cols, x)
    tl.store(rope_out + i * P + p, rope, mask=pm)


@triton.jit
def _store_indexer_kernel(
    index_f8, index_f32, slots_ptr, key_ptr, stride_page,
    PS: tl.constexpr, KPOOL: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i)
    page = slot // PS
    state = (slot % PS) // KPOOL
    d = tl.arange(0, D)
    k = tl.load(key_ptr + i * D + d).to(tl.float32)  # [D]
    amax = tl.max(tl.abs(k), axis=0)
    scale = tl.where(amax > 0, amax / 448.0, 1.0)
    q = _round_e4m3(tl.clamp(k / scale, -448.0, 448.0))
    tl.store(index_f8 + page * stride_page + state * D + d, q.to(tl.float8e4nv))  # key area
    tl.store(index_f32 + (page * stride_page + S * D + 4 * state) // 4, scale)  # scale area


@triton.jit
def _gather_indexer_kernel(
    index_f8, index_f32, slots_ptr, key_out, scale_out, stride_page,
    PS: tl.constexpr, KPOOL: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i)
    page = slot // PS
    state = (slot % PS) // KPOOL
    d = tl.arange(0, D)
    tl.store(key_out + i * D + d, tl.load(index_f8 + page * stride_page + state * D + d))
    tl.store(scale_out + i, tl.load(index_f32 + (page * stride_page + S * D + 4 * state) // 4))


def _main_views(main: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return main, main.view(FP8), main.view(torch.float32), main.view(torch.bfloat16)


def _main_meta(main: torch.Tensor, kv_dtype: str, r: int, p: int) -> dict:
    tile = QUANT_TILE if kv_dtype == "fp8_ds_mla" else r
    return dict(
        PS=main.shape[1], R=r, P=p, TILE=tile, TILES=r // tile, BLOCK_P=triton.next_power_of_2(p), KV=_KV_CODE[kv_dtype]
    )


def store_main_triton(
    main: torch.Tensor,
    slots: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    kv_dtype: str,
    fp8_scale: float = 1.0,
) -> None:
    """Same contract as ``cache_ops.store_main_torch``."""
    n, r = latent.shape
    meta = _main_meta(main, kv_dtype, r, rope.shape[1])
    lat, rp = latent.float().contiguous(), rope.float().contiguous()
    _store_main_kernel[(n,)](
        *_main_views(main), slots.contiguous(), lat, rp, main.stride(0), main.stride(1), float(fp8_scale), **meta
    )


def gather_main_triton(
    main: torch.Tensor, slots: torch.Tensor, kv_dtype: str, kv_lora_rank: int, rope_dim: int, fp8_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``cache_ops.gather_main_torch``."""
    n = slots.numel()
    latent = torch.empty((n, kv_lora_rank), dtype=torch.float32, device=main.device)
    rope = torch.empty((n, rope_dim), dtype=torch.float32, device=main.device)
    if n:
        meta = _main_meta(main, kv_dtype, kv_lora_rank, rope_dim)
        _gather_main_kernel[(n,)](
            *_main_views(main),
            slots.contiguous(),
            latent,
            rope,
            main.stride(0),
            main.stride(1),
            float(fp8_scale),
            **meta,
        )
    return latent, rope


def store_indexer_triton(
    index: torch.Tensor, slots: torch.Tensor, key: torch.Tensor, page_size: int, kpool: int = 1
) -> None:
    """Same contract as ``cache_ops.store_indexer_torch`` (a group's last token in slot order wins)."""
    if kpool > 1:
        s = page_size // kpool
        keep = last_per_key(torch.div(slots, page_size, rounding_mode="floor") * s + (slots % page_size) // kpool)
        slots, key = slots[keep], key[keep]
    d = key.shape[1]
    _store_indexer_kernel[(slots.numel(),)](
        index.view(FP8), index.view(torch.float32), slots.contiguous(), key.float().contiguous(), index.stride(0),
        PS=page_size, KPOOL=kpool, S=page_size // kpool, D=d,
    )  # fmt: skip


def gather_indexer_triton(
    index: torch.Tensor, slots: torch.Tensor, page_size: int, key_dim: int, kpool: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``cache_ops.gather_indexer_torch``."""
    n = slots.numel()
    key = torch.empty((n, key_dim), dtype=FP8, device=index.device)
    scale = torch.empty((n,), dtype=torch.float32, device=index.device)
    if n:
        _gather_indexer_kernel[(n,)](
            index.view(FP8), index.view(torch.float32), slots.contiguous(), key, scale, index.stride(0),
            PS=page_size, KPOOL=kpool, S=page_size // kpool, D=key_dim,
        )  # fmt: skip
    return key, scale
