"""GPU kinds the planner knows: the memory an engine actually sees on one device.

Vendors market HBM in round "GB" that are neither exact decimal nor exact binary figures (the H200's
"141GB" is 140.4 GiB = 150.75 GB as the driver reports it). Engines size their pools from what the
driver reports (SGLang and vLLM read ``torch.cuda.mem_get_info()``), so the planner uses the
driver-reported total and keeps the marketing figure only as a label.

| kind   | marketed            | driver-reported total            | source of the driver figure            |
|--------|---------------------|----------------------------------|----------------------------------------|
| H100   | 80GB HBM3 (SXM)     | 81,559 MiB = 85,520,809,984 B     | ``nvidia-smi``: "NVIDIA H100 80GB HBM3 ... / 81559MiB" |
| H200   | 141GB HBM3e         | 143,771 MiB = 150,754,820,096 B   | ``nvidia-smi``: "NVIDIA H200 ... / 143771MiB"          |
| B200   | 180GB HBM3e         | 183,359 MiB = 192,265,846,784 B   | ``nvidia-smi``: "NVIDIA B200 ... / 183359MiB"          |
| MI300X | 192GB HBM3          | 205,822,885,888 B                 | ``rocm-smi --showmeminfo vram``: "VRAM Total Memory (B): 205822885888" |

Pass ``--gpu-memory BYTES`` for any other device or a different driver reservation.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError

MIB = 2**20


@dataclass(frozen=True)
class GpuKind:
    """One accelerator model: the bytes the driver reports and the vendor's label."""

    name: str
    memory_bytes: int
    marketed: str
    source: str


GPU_KINDS: dict[str, GpuKind] = {
    g.name: g
    for g in (
        GpuKind("H100", 81_559 * MIB, "80GB HBM3 (SXM)", "nvidia-smi memory.total 81559 MiB"),
        GpuKind("H200", 143_771 * MIB, "141GB HBM3e", "nvidia-smi memory.total 143771 MiB"),
        GpuKind("B200", 183_359 * MIB, "180GB HBM3e", "nvidia-smi memory.total 183359 MiB"),
        GpuKind("MI300X", 205_822_885_888, "192GB HBM3", "rocm-smi VRAM Total Memory 205822885888 B"),
    )
}


def gpu_kind(name: str) -> GpuKind:
    """Look a GPU kind up by name (case-insensitive); unknown names raise with the list."""
    for kind in GPU_KINDS.values():
        if kind.name.lower() == str(name).lower():
            return kind
    raise DsakvError(f"gpu = {name!r}: known kinds are {', '.join(GPU_KINDS)} (or give --gpu-memory BYTES)")


__all__ = ["GPU_KINDS", "GpuKind", "gpu_kind"]
