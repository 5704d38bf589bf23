"""The GPU-setting arguments shared by ``dsakv plan`` and ``dsakv simulate``, and their parsing.

One definition so both commands accept the same deployment and compute the same pool: ``add_gpu_arguments``
puts the flags in a parser group, ``gpu_setting(args)`` turns them into a validated ``GpuSetting`` and
``available_bytes(args)`` reads ``--available-bytes`` (a pool budget that skips the memory split).

Numbers are taken as strings and parsed here so that bad input is one ``DsakvError`` line (exit 1)
rather than an argparse usage dump. Integers stay below 2**63 (a 400-digit value is an error naming the
limit, not an ``OverflowError`` later). Byte sizes accept plain integers (``1,048,576`` or ``1_048_576``),
an exponent (``1e15``) or a unit: ``GB``/``MB`` (10^9, 10^6) and ``GiB``/``MiB`` (2^30, 2^20).
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal

from dsakv.errors import INT64_MAX, DsakvError, short_repr
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.gpus import GPU_KINDS
from dsakv.planner.weights import MOE_A2A

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
UNITS["tib"] = 2**40
DEFAULT = GpuSetting()  # the flags' defaults


def parse_int(flag: str, text: str | None, minimum: int = 1, maximum: int = INT64_MAX) -> int | None:
    """An integer in ``minimum..maximum`` (default: up to 2**63 - 1); ``,`` and ``_`` may group digits."""
    if text is None:
        return None
    digits = str(text).strip().replace(",", "").replace("_", "")
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise DsakvError(f"{flag} = {short_repr(text)}: must be an integer >= {minimum}")
    if len(digits.lstrip("+-0")) > 19 or not minimum <= int(digits) <= maximum:  # 19 digits: int64 and below
        if digits.startswith("-") or len(digits.lstrip("+-0")) <= 19 and int(digits) < minimum:
            raise DsakvError(f"{flag} = {short_repr(text)}: must be an integer >= {minimum}")
        raise DsakvError(f"{flag} = {short_repr(text)}: must be an integer in {minimum}..{maximum:,}")
    return int(digits)


def ascii_int(text: str) -> int:
    """argparse ``type`` of the plain integer flags: ASCII digits only (Python's ``int`` reads ``'２１'`` as 21)."""
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", str(text)):
        raise argparse.ArgumentTypeError(f"{short_repr(text)}: must be an integer (ASCII digits)")
    return int(text)


def parse_indexer(flag: str, text: str | None) -> str | None:
    """``--indexer-pattern``: a full-layer count is an ASCII integer (``'２１'`` is refused, not taken as 21); 'all', an F/S
    string or a pattern name pass through."""
    if text is not None and str(text).strip().isdigit():  # isdigit() is true for any Unicode digit
        return str(parse_int(flag, text, 0))
    return text


def parse_bytes(flag: str, text: str | None, minimum: int = 1) -> int | None:
    """An integer byte count, optionally with a unit (GB = 10^9, GiB = 2^30) or an exponent (``1e15``), at most
    2**63 - 1 (fractions of a byte are dropped)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(-?[0-9][0-9_,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise DsakvError(
            f"{flag} = {short_repr(text)}: must be a byte count (an integer, or with a unit: {', '.join(UNITS)[4:]})"
        )
    number = Decimal(m.group(1).replace(",", "").replace("_", ""))
    value = (
        number * UNITS[m.group(2).lower()] if -INT64_MAX <= number <= INT64_MAX else number
    )  # 1e999999999: no product
    if value < minimum:
        raise DsakvError(f"{flag} = {short_repr(text)}: must be at least {minimum} bytes")
    if value > INT64_MAX:
        raise DsakvError(f"{flag} = {short_repr(text)}: must be at most {INT64_MAX:,} bytes (2**63 - 1)")
    return int(value)


def parse_tier_bytes(flag: str, text: str | None) -> int | str | None:
    """A tier size: a byte count as ``parse_bytes`` takes it (``2TB``, ``500GB``, ``1.5TiB``), or ``unbounded``."""
    if text is not None and str(text).strip().lower() == "unbounded":
        return "unbounded"
    try:
        return parse_bytes(flag, text, 0)
    except DsakvError:
        raise DsakvError(
            f"{flag} = {short_repr(text)}: must be a byte count (e.g. 2TB, 500GB, 1.5TiB, 1e12) or 'unbounded'"
        ) from None


def parse_float(flag: str, text: str, *, maximum: float | None = None) -> float:
    """A finite number in (0, maximum] (> 0 without ``maximum``)."""
    allowed = "a positive number" if maximum is None else f"a number in (0, {maximum:g}]"
    try:
        value = float(text)
    except ValueError:
        raise DsakvError(f"{flag} = {short_repr(text)}: must be {allowed}") from None
    if not 0 < value < float("inf") or (maximum is not None and value > maximum):
        raise DsakvError(f"{flag} = {short_repr(text)}: must be {allowed}")
    return value


def parse_fraction(flag: str, text: str) -> float:
    """A number in (0, 1]."""
    return parse_float(flag, text, maximum=1)


def parse_share(flag: str, text: str) -> float:
    """A number in [0, 1] (0 allowed: none of it)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:
        raise DsakvError(f"{flag} = {short_repr(text)}: must be a number in [0, 1]")
    return value


def add_gpu_arguments(parser: argparse.ArgumentParser, *, batched_help: str = "sizes the top-k buffer") -> None:
    """Add the "GPU setting (per rank)" group: device, parallelism, memory knobs, ``--available-bytes``."""
    g = parser.add_argument_group("GPU setting (per rank)")
    g.add_argument("--gpu", default=DEFAULT.gpu, help=f"GPU kind: {', '.join(GPU_KINDS)} (default {DEFAULT.gpu})")
    g.add_argument("--gpu-memory", help="bytes per GPU (overrides --gpu); units GB/GiB accepted")
    g.add_argument("--gpus", default=str(DEFAULT.num_gpus), help=f"number of GPUs (default {DEFAULT.num_gpus})")
    g.add_argument("--tp", help="tensor-parallel size (default: --gpus)")
    g.add_argument(
        "--dp-attention", default=str(DEFAULT.dp_attention), help="attention data-parallel groups (divides --tp)"
    )
    g.add_argument("--dcp", default=str(DEFAULT.dcp), help="decode-context-parallel size (indexer K replicated)")
    g.add_argument("--mem-fraction-static", default=str(DEFAULT.mem_fraction_static), help="fraction in (0, 1]")
    g.add_argument("--weights-bytes", help="weights per rank (default: computed from the config)")
    g.add_argument("--weight-dtype", help="weight dtype for the computed weights (default: the config's)")
    g.add_argument(
        "--activation-bytes", default=str(DEFAULT.activation_bytes), help="reserve inside the static fraction"
    )
    g.add_argument(
        "--max-batched-tokens",
        default=str(DEFAULT.max_batched_tokens),
        help=f"tokens per step (default {DEFAULT.max_batched_tokens}): {batched_help}",
    )
    g.add_argument(
        "--moe-a2a",
        default=DEFAULT.moe_a2a,
        help=f"the MoE's token exchange: {', '.join(MOE_A2A)} (deepep: whole shared experts on every rank, as SGLang's "
        "--moe-a2a-backend deepep)",
    )
    g.add_argument("--available-bytes", help="bytes for the pool on one rank (skips the memory split)")


def gpu_setting(args: argparse.Namespace) -> GpuSetting:
    """The validated ``GpuSetting`` of the parsed flags (``DsakvError`` naming the flag on bad input)."""
    return GpuSetting(
        gpu=args.gpu,
        gpu_memory_bytes=parse_bytes("--gpu-memory", args.gpu_memory),
        num_gpus=parse_int("--gpus", args.gpus),
        tp=parse_int("--tp", args.tp),
        dp_attention=parse_int("--dp-attention", args.dp_attention),
        dcp=parse_int("--dcp", args.dcp),
        mem_fraction_static=parse_fraction("--mem-fraction-static", args.mem_fraction_static),
        weights_bytes=parse_bytes("--weights-bytes", args.weights_bytes, 0),
        weight_dtype=args.weight_dtype,
        activation_bytes=parse_bytes("--activation-bytes", args.activation_bytes, 0),
        max_batched_tokens=parse_int("--max-batched-tokens", args.max_batched_tokens),
        moe_a2a=args.moe_a2a,
    )


def available_bytes(args: argparse.Namespace) -> int | None:
    return parse_bytes("--available-bytes", args.available_bytes)


__all__ = [
    "UNITS",
    "add_gpu_arguments",
    "available_bytes",
    "gpu_setting",
    "parse_bytes",
    "parse_float",
    "parse_fraction",
    "parse_int",
]
