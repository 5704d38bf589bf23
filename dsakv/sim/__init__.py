"""Trace-driven simulator: the real scheduler, allocator and radix tree without tensors, a step-time model
in place of the GPU, and reports (``docs/metrics.md``). Entry point: ``dsakv.sim.run(cfg, source)``."""

from dsakv.sim.runner import run

__all__ = ["run"]
