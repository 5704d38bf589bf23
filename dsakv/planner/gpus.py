"""The GPU catalogue: per GPU kind, the memory an engine actually sees on one device and the speeds the
simulator's roofline step time prices a step with. One table, one lookup (``gpu_kind``), one error wording.

Memory. Vendors market HBM in round "GB" that are neither exact decimal nor exact binary figures (the H200's
"141GB" is 140.4 GiB = 150.75 GB as the driver reports it). Engines size their pools from what the
driver reports (SGLang and vLLM read ``torch.cuda.mem_get_info()``), so the planner uses the
driver-reported total and keeps the marketing figure only as a label.

| kind   | marketed            | total the planner uses           | source                                  |
|--------|---------------------|----------------------------------|----------------------------------------|
| H100   | 80GB HBM3 (SXM)     | 81,559 MiB = 85,520,809,984 B     | ``nvidia-smi``: "NVIDIA H100 80GB HBM3 ... / 81559MiB" |
| H800   | 80GB HBM3 (SXM)     | 81,559 MiB (the H100's)          | same 80GB HBM3 board as the H100 SXM (export variant: NVLink cut to 400 GB/s) |
| H200   | 141GB HBM3e         | 143,771 MiB = 150,754,820,096 B   | ``nvidia-smi``: "NVIDIA H200 ... / 143771MiB"          |
| H20    | 96GB HBM3           | 97,871 MiB = 102,625,181,696 B    | ``nvidia-smi``: "NVIDIA H20 ... / 97871MiB" (NVIDIA/nccl-tests#338) |
| H20-3e | 141GB HBM3e         | 143,771 MiB (the H200's)         | the H20 with the H200's 141GB HBM3e stacks, the name ``nvidia-smi`` prints for it (NVIDIA/nvbandwidth#48); hardware logs print "NVIDIA H20-3e, 143771 MiB" |
| B200   | 180GB HBM3e         | 183,359 MiB = 192,265,846,784 B   | ``nvidia-smi``: "NVIDIA B200 ... / 183359MiB"          |
| B300   | 288GB HBM3e         | 275,040 MiB = 288,400,343,040 B   | ``nvidia-smi``: "NVIDIA B300 SXM6 AC, 275040 MiB"; AIConfigurator ``systems/b300_sxm.yaml``: ``mem_capacity: 288400343040 # 275040MiB reported by nvidia-smi`` |
| GB200  | 186GB HBM3e per GPU | 189,471 MiB = 198,674,743,296 B   | ``nvidia-smi``: "NVIDIA GB200, 189471 MiB"; AIConfigurator ``systems/gb200.yaml``: ``mem_capacity: 198674743296 # 189471MiB reported by nvidia-smi`` |
| GB300  | 288GB HBM3e per GPU | 284,208 MiB = 298,013,687,808 B   | ``nvidia-smi`` on a GB300 NVL72 tray: "NVIDIA GB300, 284208 MiB"; AIConfigurator ``systems/gb300.yaml``: ``mem_capacity: 298013687808 # 284208MiB reported by nvidia-smi`` |
| MI300X | 192GB HBM3          | 205,822,885,888 B                 | ``rocm-smi --showmeminfo vram``: "VRAM Total Memory (B): 205822885888" |
| MI355X | 288GB HBM3E         | 308,902,100,992 B                 | ``rocm-smi`` on an MI350-series part (gfx950, the MI355X's eight 36 GB HBM3E stacks): "VRAM Total Memory (B)": "308902100992", 288 GiB less 320 MiB as the MI300X's is 192 GiB less 320 MiB; an SGLang log on one (sgl-project/sglang#18263) has 287.18 GiB free before loading, which 288 decimal GB (268.2 GiB) could not hold |

Pass ``--gpu-memory BYTES`` for any other device or a different driver reservation.

Host link (the host tier's copies, ``dsakv.sim.transfers``): PCIe Gen5 x16 on every kind but the GB200 / GB300, at
55 GB/s per direction (63 GB/s raw: 32 GT/s x 16 lanes, 128b/130b; pinned ``cudaMemcpyAsync`` reaches about
55); GB200 and GB300: NVLink-C2C, 900 GB/s bidirectional from one Grace CPU to its two GPUs (GB200 NVL72
datasheet; the GB300 board keeps the 1 Grace : 2 GPU pairing), so 225 GB/s per GPU per direction. GPUs per node
(sharing one host's memory): 8 on HGX/OAM boards, 4 in a GB200 / GB300 NVL72 compute tray (2 Grace + 4 GPUs).

Speed. Dense peak throughput (vendor datasheets, no sparsity), HBM bandwidth, the per-GPU one-direction
NVLink / Infinity Fabric bandwidth and its small-message latency, and the head count the sparse-MLA kernels
pad a rank's query heads to (FlashMLA: 64 on Hopper, 128 on Blackwell); ``docs/steptime.md`` lists them
with the efficiencies applied. AMD: SGLang's DSA backend on ROCm runs TileLang sparse-MLA kernels whose head tile is
max(next power of two of the rank's heads, 16) (``padded_H`` in its ``tilelang_kernel.py``). The one published
rate of such a kernel, 1.41 ms for 1,024 queries x 16 heads x top-k 2,048 on an MI355 (52 TFLOP/s; a fork's
README_PR.md, github.com/vivienfanghuagood/sglang, late 2025), is the single-kernel TileLang path that SGLang
replaced on ROCm by split-K partial + combine kernels (sgl-project/sglang#18488, 2026-02-10, decode on MI355;
#19945, 2026-03-24, MI300 too; at 7bd1a9d16, 0.5.13.post1, every ``tilelang_sparse_fwd`` call on ROCm, prefill
included, takes them): it prices no build on file. The catalogue keeps Hopper's 64-head
padding at FlashMLA's efficiency for the AMD rows (docs/steptime.md, known gaps).

| kind   | bf16 / fp8 dense TFLOP/s | HBM TB/s | link (one direction) | source |
|--------|--------------------------|----------|----------------------|--------|
| H100   | 989.4 / 1978.9           | 3.35     | NVLink 4, 450 GB/s   | NVIDIA H100 SXM datasheet |
| H800   | 989.4 / 1978.9           | 3.35     | NVLink 4, 200 GB/s   | H800 SXM: H100 compute, NVLink 400 GB/s bidirectional (DeepSeek-V3 report, sec. 3.1) |
| H200   | 989.4 / 1978.9           | 4.8      | NVLink 4, 450 GB/s   | NVIDIA H200 SXM datasheet |
| H20    | 148 / 296                | 4.0      | NVLink 4, 450 GB/s   | H20 product brief as reported (willitrunai.com/es/gpus/h20-96gb: 148 TFLOPS FP16, 296 INT8, 4.0 TB/s, NVLink 900 GB/s bidirectional); fp8 = the int8 rate, as on every Hopper part |
| H20-3e | 148 / 296                | 4.8      | NVLink 4, 450 GB/s   | the H20's compute and links, HBM3e at 4.8 TB/s (NVIDIA's figure as quoted in NVIDIA/nvbandwidth#48; tile-ai/TileOPs#1658: 4.80 TB/s, 148 bf16 / 296 fp8 dense TFLOPS) |
| B200   | 2250 / 4500              | 8.0      | NVLink 5, 900 GB/s   | NVIDIA HGX B200 datasheet (dense) |
| B300   | 2250 / 4500              | 8.0      | NVLink 5, 900 GB/s   | HGX B300 per GPU (glennklockwood.com/garden/processors/B300: BF16 2250 / FP8 4500 dense, 8 TB/s; NVLink 5 1.8 TB/s bidirectional, acecloud.ai/blog/nvidia-hgx-b300) |
| GB200  | 2500 / 5000              | 8.0      | NVLink 5 switch, 900 GB/s | NVIDIA GB200 NVL72 datasheet, per GPU, dense |
| GB300  | 2500 / 5000              | 8.0      | NVLink 5 switch, 900 GB/s | GB300 NVL72 per GPU, dense (verda.com/blog/gb300-nvl72-architecture: FP8 5 PFLOPS, BF16 2.5 PFLOPS without sparsity, 8 TB/s, NVLink 5 900 GB/s one direction; the rack's 360 PFLOPS dense FP8 / 72) |
| MI300X | 1307.4 / 2614.9          | 5.3      | Infinity Fabric, 448 GB/s | AMD Instinct MI300X datasheet; computed: 304 CUs x 4,096 FP8 FLOP per CU per clock x 2.1 GHz |
| MI355X | 2516.6 / 5033.2          | 8.0      | Infinity Fabric, 537.6 GB/s | computed: 256 CUs x 8,192 FP8 FLOP per CU per clock (CDNA 4, doubled from the MI300X's 4,096; ISSCC 2026 as reported by world-today-news.com/?p=7253162) x 2.4 GHz = 5033.2 TFLOP/s, bf16 half; 8 TB/s (theregister.com, above); links: 7 x 153.6 GB/s bidirectional / 2 |

Streaming multiprocessors (``sm_count``; AMD: compute units), the CTAs one wave of a kernel runs: H100 / H800 / H200
132 (H100 SXM5; the H800 and H200 are that board with other links and HBM), H20 / H20-3e 78 (as engines tune for it:
SGLang's DeepEP runs on H20 need ``num_sms`` below 96, "H20 has 78 SMs"), B200 148, B300 and GB300 160, GB200 152 (as
kernel code sizes its grids and clusters for each: "B200 (148 SMs) -> 74, B300 (160 SMs) -> 80", "tuned on GB300 (160
SMs)", "GB200 (152 SMs)"), MI300X 304 and MI355X 256 CUs (the counts the peaks above are computed from). The step time
uses them for FlashMLA's sparse prefill kernel, which runs one query row's heads per CTA (pair) and so fills the GPU
only with enough rows (docs/steptime.md, fact 44).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dsakv.errors import DsakvError, check_choice

MIB = 2**20
TERA = 1e12
# PCIe Gen5 x16: 32 GT/s x 16 lanes x 128b/130b = 63 GB/s per direction raw; 55 GB/s is what pinned-memory
# cudaMemcpyAsync reaches (docs/steptime.md, assumption 9: the offload copies use the same figure)
PCIE5_X16_BYTES_PER_S = 55e9
# GB200: NVLink-C2C gives the Grace CPU 900 GB/s bidirectional to its two B200s (GB200 NVL72 datasheet):
# 450 GB/s per direction, shared by two GPUs
NVLINK_C2C_PER_GPU_BYTES_PER_S = 900e9 / 2 / 2


def cdna_fp8_flops(compute_units: int, fp8_flop_per_cu_clock: int, clock_hz: float) -> float:
    """Dense FP8 matrix peak of an AMD CDNA part from its CUs, per-CU FLOP per clock and peak clock (bf16: half)."""
    return compute_units * fp8_flop_per_cu_clock * clock_hz


# One kernel node of a replayed CUDA graph on H200 (launch, drain and dependency resolution, no work to speak of):
# RRZE-HPC/gpu-benches gpu-small-kernels/h200_graph.txt (commit 1038c5d), its smallest row, 64 kB per kernel
# ("4096  64kB  48  49  51  51  52  50" GB/s over block sizes 32 .. 1024): 65,536 B at the row's median rate.
# Serving engines replay decode steps as CUDA graphs (SGLang, vLLM), so this is the gap every kernel of a step
# pays. No datacenter Blackwell or CDNA figure is published: those kinds take the Hopper figure (docs/steptime.md).
RRZE_H200_GRAPH_64KB_GBPS = (48, 49, 51, 51, 52, 50)
H200_GRAPH_KERNEL_NODE_S = 65_536 / (statistics.median(RRZE_H200_GRAPH_64KB_GBPS) * 1e9)  # 1.30 us

MI300X_FP8 = cdna_fp8_flops(304, 4096, 2.1e9)  # CDNA 3: 304 CUs (38 x 8 XCDs), 2.1 GHz -> 2614.9 TFLOP/s
MI355X_FP8 = cdna_fp8_flops(256, 8192, 2.4e9)  # CDNA 4: 256 CUs (32 x 8 XCDs), 2.4 GHz -> 5033.2 TFLOP/s


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
    interconnect: str = "NVLink 4"
    link_latency_s: float = 8e-6  # one small-message collective (all-reduce / all-to-all hop) on the link
    mla_head_pad: int = (
        64  # sparse-MLA kernels pad a rank's query heads up to this (FlashMLA: 64 Hopper, 128 Blackwell)
    )
    host_link: str = "PCIe Gen5 x16"  # the device <-> host-memory link the host tier's copies cross
    host_link_bytes_per_s: float = PCIE5_X16_BYTES_PER_S  # one direction, per GPU
    gpus_per_node: int = 8  # GPUs sharing one host's memory (an HGX board; a GB200 / GB300 compute tray has 4)
    arch: str = "hopper"  # kernel generation: which published kernel rates apply (hopper, blackwell, cdna3, cdna4)
    kernel_node_s: float = H200_GRAPH_KERNEL_NODE_S  # one kernel of a replayed CUDA graph (Hopper's measured figure)
    sm_count: int = 0  # streaming multiprocessors (AMD: compute units): how many CTAs one wave of a kernel runs

    def __post_init__(self) -> None:
        if self.sm_count < 1:
            raise DsakvError(f"gpu {self.name!r}: sm_count = {self.sm_count}: must be at least 1 (its datasheet's SMs)")


GPU_KINDS: dict[str, GpuKind] = {
    g.name: g
    for g in (
        GpuKind(
            "H100", 81_559 * MIB, "80GB HBM3 (SXM)", "nvidia-smi memory.total 81559 MiB",
            989.4 * TERA, 1978.9 * TERA, 3.35 * TERA, 450e9, "NVIDIA H100 SXM datasheet",
            sm_count=132,
        ),
        GpuKind(
            "H800", 81_559 * MIB, "80GB HBM3 (SXM)", "the H100 SXM board's 81559 MiB",
            989.4 * TERA, 1978.9 * TERA, 3.35 * TERA, 200e9,
            "H100 SXM datasheet compute; NVLink 400 GB/s bidirectional (DeepSeek-V3 report)",
            sm_count=132,
        ),
        GpuKind(
            "H200", 143_771 * MIB, "141GB HBM3e", "nvidia-smi memory.total 143771 MiB",
            989.4 * TERA, 1978.9 * TERA, 4.8 * TERA, 450e9, "NVIDIA H200 SXM datasheet",
            sm_count=132,
        ),
        GpuKind(
            "H20", 97_871 * MIB, "96GB HBM3", "nvidia-smi memory.total 97871 MiB (NVIDIA/nccl-tests#338)",
            148 * TERA, 296 * TERA, 4.0 * TERA, 450e9, "NVIDIA H20 product brief",
            sm_count=78,
        ),
        GpuKind(
            "H20-3e", 143_771 * MIB, "141GB HBM3e", "nvidia-smi memory.total 143771 MiB (the H200's HBM3e stacks)",
            148 * TERA, 296 * TERA, 4.8 * TERA, 450e9, "H20 compute; HBM3e 4.8 TB/s (NVIDIA/nvbandwidth#48)",
            sm_count=78,
        ),
        GpuKind(
            "B200", 183_359 * MIB, "180GB HBM3e", "nvidia-smi memory.total 183359 MiB",
            2250 * TERA, 4500 * TERA, 8.0 * TERA, 900e9, "NVIDIA HGX B200 datasheet (dense)",
            "NVLink 5", 8e-6, 128, arch="blackwell",
            sm_count=148,
        ),
        GpuKind(
            "B300", 275_040 * MIB, "288GB HBM3e", "nvidia-smi memory.total 275040 MiB",
            2250 * TERA, 4500 * TERA, 8.0 * TERA, 900e9, "NVIDIA HGX B300 datasheet (dense = sparse / 2)",
            "NVLink 5", 8e-6, 128, arch="blackwell",
            sm_count=160,
        ),
        GpuKind(
            "GB200", 189_471 * MIB, "186GB HBM3e", "nvidia-smi memory.total 189471 MiB",
            2500 * TERA, 5000 * TERA, 8.0 * TERA, 900e9, "NVIDIA GB200 NVL72 datasheet, per GPU, dense",
            "NVLink 5 switch", 8e-6, 128, "NVLink-C2C", NVLINK_C2C_PER_GPU_BYTES_PER_S, 4, "blackwell",
            sm_count=152,
        ),
        GpuKind(
            "GB300", 284_208 * MIB, "288GB HBM3e", "nvidia-smi memory.total 284208 MiB",
            2500 * TERA, 5000 * TERA, 8.0 * TERA, 900e9, "GB300 NVL72 per GPU, dense (rack: 360 PFLOPS fp8 / 72)",
            "NVLink 5 switch", 8e-6, 128, "NVLink-C2C", NVLINK_C2C_PER_GPU_BYTES_PER_S, 4, "blackwell",
            sm_count=160,
        ),
        GpuKind(
            "MI300X", 205_822_885_888, "192GB HBM3", "rocm-smi VRAM Total Memory 205822885888 B",
            MI300X_FP8 / 2, MI300X_FP8, 5.3 * TERA, 448e9, "AMD Instinct MI300X datasheet (304 CUs x 4,096 x 2.1 GHz)",
            "Infinity Fabric", 12e-6, 64, arch="cdna3",
            sm_count=304,
        ),
        GpuKind(
            "MI355X", 308_902_100_992, "288GB HBM3E", "rocm-smi VRAM Total Memory 308902100992 B (MI350 series)",
            MI355X_FP8 / 2, MI355X_FP8, 8.0 * TERA, 537.6e9, "CDNA 4: 256 CUs x 8,192 FP8 FLOP/clock x 2.4 GHz (ISSCC 2026)",
            "Infinity Fabric", 12e-6, 64, arch="cdna4",
            sm_count=256,
        ),
    )
}  # fmt: skip
_CANONICAL = {name.lower(): name for name in GPU_KINDS}


def gpu_kind(name: str) -> GpuKind:
    """Look a GPU kind up by name (case-insensitive); an unknown name raises ``DsakvError`` with the list
    (``gpu = 'A100': must be one of H100, H800, H200, H20, H20-3e, ...``)."""
    canonical = _CANONICAL.get(str(name).lower(), name)
    check_choice("gpu", canonical, GPU_KINDS)
    return GPU_KINDS[canonical]


__all__ = ["GPU_KINDS", "GpuKind", "gpu_kind"]
