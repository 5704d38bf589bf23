"""Step-time settings files: the roofline's efficiencies and fixed costs, as ``dsakv calibrate --log`` fits them
and ``dsakv simulate --step-settings FILE`` uses them.

The file is JSON::

    {"format": "dsakv-step-settings", "version": 1,
     "settings": {"bw_eff": 0.61, "indexer_eff": 0.52, ...},
     "fit": {...what the calibration measured, for people; ignored when read}}

Only ``STEP_SETTING_FIELDS`` may appear in ``settings``; each is checked by ``RooflineStepTime`` itself when
applied (efficiencies in (0, 1], seconds >= 0), so a bad value is one ``DsakvError`` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from dsakv.errors import DsakvError
from dsakv.sim.steptime import RooflineStepTime
from dsakv.spec.jsonio import read_json_file

FORMAT, VERSION = "dsakv-step-settings", 1
EFFICIENCIES = ("gemm_eff", "moe_eff", "mla_prefill_eff", "mla_decode_eff", "indexer_eff", "bw_eff", "link_eff")
SECONDS = ("layer_floor_s", "indexer_floor_s", "layer_min_s", "overhead_s", "spec_host_s", "eager_layer_s")
STEP_SETTING_FIELDS = EFFICIENCIES + SECONDS

Settings = tuple[tuple[str, float], ...]


def check_settings(settings: dict, where: str) -> Settings:
    """The settings as a sorted tuple of (field, value); ``DsakvError`` naming ``where`` and the field otherwise."""
    if not isinstance(settings, dict) or not settings:
        raise DsakvError(f"{where}: 'settings' must be a non-empty object of {', '.join(STEP_SETTING_FIELDS)}")
    out = []
    for name, value in settings.items():
        if name not in STEP_SETTING_FIELDS:
            raise DsakvError(f"{where}: settings.{name}: must be one of {', '.join(STEP_SETTING_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DsakvError(f"{where}: settings.{name} = {value!r}: must be a finite number")
        out.append((name, float(value)))
    return tuple(sorted(out))


def load_step_settings(path: str) -> Settings:
    """Read a settings file (see the module's docstring)."""
    where = f"--step-settings {path}"
    data = read_json_file(path, "--step-settings")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DsakvError(f'{where}: not a step-settings file (needs "format": "{FORMAT}")')
    if data.get("version") != VERSION:
        raise DsakvError(f"{where}: version = {data.get('version')!r}: must be {VERSION}")
    return check_settings(data.get("settings"), where)


def apply_step_settings(step_time, settings: Settings):
    """``step_time`` with ``settings`` replaced (a roofline only; its own checks apply)."""
    if not settings:
        return step_time
    if not isinstance(step_time, RooflineStepTime):
        raise DsakvError("step_settings: apply to the roofline step-time model (--step-model roofline)")
    return replace(step_time, **dict(settings))


def write_step_settings(path: str, settings: dict[str, float], fit: dict) -> None:
    """Write a settings file (the fit's report beside the values, for people)."""
    check_settings(settings, f"settings for {path}")
    text = json.dumps({"format": FORMAT, "version": VERSION, "settings": settings, "fit": fit}, indent=2)
    try:
        Path(path).write_text(text + "\n")
    except OSError as exc:
        raise DsakvError(f"--out {path}: cannot write ({exc.strerror})") from None


__all__ = [
    "EFFICIENCIES",
    "STEP_SETTING_FIELDS",
    "Settings",
    "apply_step_settings",
    "check_settings",
    "load_step_settings",
    "write_step_settings",
]
