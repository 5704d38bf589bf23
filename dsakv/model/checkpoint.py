"""Reading a Hugging Face checkpoint folder: ``config.json`` plus ``model.safetensors`` or a sharded
``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file), read with the ``safetensors``
library (the ``checkpoints`` extra; imported lazily).

Block-scaled FP8 weights, as the public FP8 checkpoints store them: an ``float8_e4m3fn`` ``W [out, in]``
with ``W_scale_inv [ceil(out/128), ceil(in/128)]`` fp32; the weight is ``W * scale_inv`` of its 128 x 128
block, dequantized on load. Layers ``model.layers.{i}`` with ``i >= num_layers`` are skipped: the MTP / draft
layers when the caller passes ``num_hidden_layers``, all but the first MTP layer with ``num_hidden_layers + 1``. Before anything is read, the bytes the model will hold (every kept tensor in the compute dtype) are
compared with the machine's available memory: too large is a one-line ``DsakvError`` naming both.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dsakv.errors import DsakvError

FP8_BLOCK = 128
SCALE_SUFFIX = "_scale_inv"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _safetensors():
    try:
        import safetensors.torch  # noqa: F401
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - depends on the install
        raise DsakvError(
            "reading checkpoints needs the 'safetensors' package: pip install 'dsakv[checkpoints]'"
        ) from None
    return safe_open


def checkpoint_files(folder: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded index, one file, or every ``*.safetensors``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DsakvError(f"checkpoint {str(folder)!r}: not a folder (give the folder with config.json)")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DsakvError(f"checkpoint index {str(index)!r}: cannot read its weight_map ({exc})") from None
        missing = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
        if missing:
            raise DsakvError(f"checkpoint index {str(index)!r}: shard {missing[0]!r} is missing")
        return {name: folder / f for name, f in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DsakvError(f"checkpoint {str(folder)!r}: no model.safetensors or model.safetensors.index.json")
    safe_open = _safetensors()
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as handle:
            out.update({name: f for name in handle.keys()})
    return out


def _kept(name: str, num_layers: int) -> bool:
    m = _LAYER.match(name)
    return m is None or int(m.group(1)) < num_layers


@dataclass(frozen=True)
class CheckpointSize:
    tensors: int
    bytes_needed: int  # every kept tensor in the compute dtype, scales folded in


def checkpoint_size(files: dict[str, Path], num_layers: int, dtype: torch.dtype) -> CheckpointSize:
    """Bytes the loaded weights take, from the safetensors headers only (nothing is read)."""
    safe_open = _safetensors()
    total, count = 0, 0
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        if _kept(name, num_layers) and not name.endswith(SCALE_SUFFIX):
            by_file.setdefault(f, []).append(name)
    item = torch.empty(0, dtype=dtype).element_size()
    for f, names in by_file.items():
        with safe_open(str(f), "pt") as handle:
            for name in names:
                numel = 1
                for d in handle.get_slice(name).get_shape():
                    numel *= d
                total += numel * item
                count += 1
    return CheckpointSize(count, total)


def available_memory_bytes() -> int:
    """Physical memory the OS reports available now (CPU: the model's weights live there)."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(folder: str | Path, size: CheckpointSize, available: int | None = None) -> None:
    available = available_memory_bytes() if available is None else available
    if size.bytes_needed > available:
        raise DsakvError(
            f"checkpoint {str(folder)!r} needs {size.bytes_needed:,} bytes ({size.bytes_needed / 2**30:.1f} GiB) "
            f"of weights; this machine has {available:,} bytes ({available / 2**30:.1f} GiB) available"
        )


def dequantize_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """``weight [out, in]`` fp8 times the fp32 ``scale_inv`` of its ``block x block`` tile -> fp32."""
    out, inp = weight.shape
    rows = scale_inv.float().repeat_interleave(block, 0)[:out]
    return weight.float() * rows.repeat_interleave(block, 1)[:, :inp]


def iter_weights(
    folder: str | Path, num_layers: int, dtype: torch.dtype = torch.float32, *, available: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` in ``dtype`` for every kept tensor, FP8 blocks dequantized; checks the size
    first (``available`` overrides the machine's available memory)."""
    files = checkpoint_files(folder)
    check_fits(folder, checkpoint_size(files, num_layers, dtype), available)
    safe_open = _safetensors()
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        if _kept(name, num_layers) and not name.endswith(SCALE_SUFFIX):
            by_file.setdefault(f, []).append(name)
    for f, names in by_file.items():
        with safe_open(str(f), "pt") as handle:
            for name in names:
                t = handle.get_tensor(name)
                scale_name = name + SCALE_SUFFIX
                if t.dtype == torch.float8_e4m3fn:
                    if scale_name not in files:
                        raise DsakvError(f"checkpoint tensor {name!r}: fp8 without {scale_name!r}")
                    with safe_open(str(files[scale_name]), "pt") as sh:
                        t = dequantize_block_fp8(t, sh.get_tensor(scale_name))
                yield name, t.to(dtype)


__all__ = [
    "FP8_BLOCK",
    "CheckpointSize",
    "available_memory_bytes",
    "check_fits",
    "checkpoint_files",
    "checkpoint_size",
    "dequantize_block_fp8",
    "iter_weights",
]
