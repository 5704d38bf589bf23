"""The GPU catalogue: per GPU kind, the memory an engine actually sees on one device and the speeds the
simulator's roofline step time prices a step with. One table, one lookup (``gpu_kind``), one error wording.

Memory. Vendors market HBM in round "GB" that are neither exact decimal nor exact binary figures (the H200's
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

Speed. Dense peak throughput (vendor datasheets, no sparsity), HBM bandwidth and the per-GPU one-direction
NVLink / Infinity Fabric bandwidth; ``docs/steptime.md`` lists them with the efficiencies applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import check_choice

MIB = 2**20
TERA = 1e12


@dataclass(frozen=True)
class GpuKind:
    """One accelerator model: the bytes the driver reports, the vendor's label, and its peak speeds."""

    name: str
    memory_bytes: int
    marketed: str
    memory_source: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # per-GPU one-direction NVLink / Infinity Fabric bandwidth
    speed_source: str


GPU_KINDS: dict[str, GpuKind] = {
    g.name: g
    for g in (
        GpuKind(
            "H100", 81_559 * MIB, "80GB HBM3 (SXM)", "nvidia-smi memory.total 81559 MiB",
            989.4 * TERA, 1978.9 * TERA, 3.35 * TERA, 450e9, "NVIDIA H100 SXM datasheet",
        ),
        GpuKind(
            "H200", 143_771 * MIB, "141GB HBM3e", "nvidia-smi memory.total 143771 MiB",
            989.4 * TERA, 1978.9 * TERA, 4.8 * TERA, 450e9, "NVIDIA H200 SXM datasheet",
        ),
        GpuKind(
            "B200", 183_359 * MIB, "180GB HBM3e", "nvidia-smi memory.total 183359 MiB",
            2250 * TERA, 4500 * TERA, 8.0 * TERA, 900e9, "NVIDIA HGX B200 datasheet (dense)",
        ),
        GpuKind(
            "MI300X", 205_822_885_888, "192GB HBM3", "rocm-smi VRAM Total Memory 205822885888 B",
            1307.4 * TERA, 2614.9 * TERA, 5.3 * TERA, 448e9, "AMD Instinct MI300X datasheet",
        ),
    )
}  # fmt: skip
_CANONICAL = {name.lower(): name for name in GPU_KINDS}


def gpu_kind(name: str) -> GpuKind:
    """Look a GPU kind up by name (case-insensitive); an unknown name raises ``DsakvError`` with the list
    (``gpu = 'A100': must be one of H100, H200, B200, MI300X``)."""
    canonical = _CANONICAL.get(str(name).lower(), name)
    check_choice("gpu", canonical, GPU_KINDS)
    return GPU_KINDS[canonical]


__all__ = ["GPU_KINDS", "GpuKind", "gpu_kind"]
