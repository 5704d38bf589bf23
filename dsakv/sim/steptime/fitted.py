"""The step time's fitted numbers: two efficiencies, each a fraction of a datasheet peak and one number for every
GPU kind. Everything else the roofline uses is derived (docs/steptime.md, constants: formula and source of each).

Fitted on the shared anchors (``../shared/data/calibration/anchors.csv``: gpustack's DeepSeek-V3.2 H200 rows, vLLM
v0.13 TP8 and SGLang v0.5.6 DP8, and InferenceX's DeepSeek-R1 H200 SGLang TP8 rows) with every derived term in place:
``python bench/calibrate.py --anchors ../shared/data/calibration/anchors.csv --set bw_eff=B --set link_eff=L --set
indexer_eff=I`` over a grid (docs/steptime-log.md, 2026-12-01 session 2, the scans): the point with every figure in
its band, every geometric mean within 0.9-1.1 and the least loss. ``FITTED`` lists them for the constants table and its test.
``LINK_EFF`` was refitted on 2026-12-07 (fifth sitting) once the fused MoE's activations were priced (docs/steptime.md,
fact 43): 0.28 → 0.35, the grid's point with every figure in band (``bw_eff`` 0.60 and ``indexer_eff`` 0.64 kept).
Until 2026-12-07 (twelfth sitting) the indexer's efficiency was a third fitted number (0.64, which the anchors barely
constrain: 0.55 and 0.64 gave the same loss within the grid's noise); it is now DeepGEMM's measured rate
(``kernels.DEEPGEMM_MQA_LOGITS_EFF``, 0.549; docs/steptime.md fact 45), and the two above kept their values.
"""

from __future__ import annotations

# Every byte a step reads or writes from HBM (weights, cache rows, indexer keys, activations) is priced at this
# fraction of the datasheet bandwidth, but the routed experts' weights where an engine runs them in a kernel with a
# published rate (DeepGEMM's grouped GEMMs, TensorRT-LLM's and AITER's fused MoE: ``kernels``, facts 35-38). Bound: DeepGEMM's
# decode-size GEMMs stream at 0.84 (``kernels.GEMM_STREAM_EFF``);
# the fit also carries what a step reads below streaming rate (expert weights of few tokens, paged cache rows).
BW_EFF = 0.6
# Collectives' bytes are priced at this fraction of the one-direction link bandwidth (their latency is the GPU kind's
# ``link_latency_s`` per collective). Bound: NCCL's effective NVLink bus bandwidth, 370 of 450 GB/s (0.82,
# NVIDIA/nccl-tests#212), at large messages; a step's all-reduces are small. Below the bound it still carries prefill
# work the model leaves out (the DSA attention module's prefill, measured 1.2-1.6x dsakv's price: facts 42-43).
LINK_EFF = 0.35

FITTED = {"bw_eff": BW_EFF, "link_eff": LINK_EFF}
# What each fitted efficiency may not exceed, from a published measurement: DeepGEMM's streaming fraction (derived in
# ``kernels``), NCCL's effective NVLink bus bandwidth (370 of 450 GB/s, NVIDIA/nccl-tests#212), and the fp8 peak.
NCCL_NVLINK_BUS_EFF = 370 / 450
