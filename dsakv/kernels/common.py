"""What the torch references and the Triton wrappers of the cache kernels share: the fp8 dtype and the
last-writer rule of grouped indexer states. Both ``cache_ops`` and ``cache_ops_triton`` import from here,
never from each other."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn  # the e4m3 format of fp8 cache bytes (max 448, ``dsakv.spec.layout.FP8_E4M3_MAX``)


def last_per_key(keys: torch.Tensor) -> torch.Tensor:
    """Positions ``i`` such that ``keys[i]`` does not occur again later (the last writer of each key).

    With ``index_kpool`` N > 1 several tokens of a call map to one indexer state; keeping only these
    positions makes the last token (in slot order) the one stored, on every backend.
    """
    order = torch.arange(keys.numel(), device=keys.device)
    last = torch.full((int(keys.max()) + 1,), -1, dtype=torch.long, device=keys.device)
    last.scatter_reduce_(0, keys, order, reduce="amax")
    return order[last[keys] == order]
