"""Kernels: each Triton kernel sits beside a plain-torch reference with the same signature, and a
dispatcher picks Triton on CUDA (or when ``DSAKV_KERNELS=triton``, e.g. under ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_available() -> bool:
    """Whether triton is installed (looked up once: a filesystem search on every kernel call showed in profiles)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(device: torch.device | str) -> bool:
    """Triton on CUDA tensors, or anywhere when DSAKV_KERNELS=triton (the CPU interpreter in tests)."""
    choice = os.environ.get("DSAKV_KERNELS", "auto")
    if choice == "torch" or not triton_available():
        return False
    if choice == "triton":
        return True
    return torch.device(device).type == "cuda"
