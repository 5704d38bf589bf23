"""``dsakv calibrate --log FILE``: the roofline's efficiencies fitted to the steps an SGLang log measured.

Each of the log's gaps (``dsakv.telemetry.log_reader.Gap``: a decode line's ``K x running / gen throughput``
seconds, a prefill line's ``new tokens / input throughput``) is the sum of the steps that filled it. A step is
rebuilt from what its line printed: a prefill batch of ``new`` tokens over ``seqs`` sequences after ``context``
tokens (split evenly), a decode batch of ``running`` requests whose contexts sum to the pool's used tokens less
half a page each (a request's last page is on average half full). The model's gap is the roofline's
``step_seconds`` of those steps (times their repeat count); the fit minimises the relative error of every gap
(``scipy.optimize.least_squares``, a soft-L1 loss so that a gap stretched by idle time weighs little), over the
logarithm of each fitted field.

Which fields are fitted: the log determines *units* (``FIT_UNITS``), each one factor applied to its fields: the
prefill's linear, MoE and sparse-MLA terms all grow with the new tokens, so a log cannot tell their three
efficiencies apart, only their common scale ("prefill compute"). Units are chosen at the current estimate from the
Jacobian of the relative errors: in order of influence, a unit joins while its column's RMS (the relative change
of a gap per e-fold of the unit) is at least ``MIN_INFLUENCE`` and the chosen columns stay well conditioned
(``MAX_CONDITION``, columns scaled to unit RMS); the others keep their values and are reported as not determined.
Selection and fit run twice (a unit that binds only at the fitted point joins on the second round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dsakv.errors import DsakvError
from dsakv.sim.steptime import RooflineStepTime
from dsakv.telemetry.log_reader import Gap, LogFacts

FIT_UNITS: dict[str, tuple[str, ...]] = {
    "hbm bandwidth": ("bw_eff",),
    "step overhead": ("overhead_s",),
    "prefill compute": ("gemm_eff", "moe_eff", "mla_prefill_eff"),
    "sparse-MLA decode": ("mla_decode_eff",),
    "indexer": ("indexer_eff",),
}
FIT_FIELDS = tuple(f for fields in FIT_UNITS.values() for f in fields)
MIN_INFLUENCE = 0.01
MAX_CONDITION = 10.0
MAX_GAPS = 1500  # gaps fitted, evenly spread over the log's sample
MIN_GAPS = 8


@dataclass(frozen=True)
class FieldFit:
    name: str
    unit: str  # the FIT_UNITS entry that scales it
    start: float
    value: float
    determined: bool
    influence: float  # RMS relative change of a gap per e-fold of its unit, at the fitted point

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KindError:
    kind: str  # "decode" (decode lines' gaps) or "prefill" (prefill lines' gaps)
    gaps: int
    median_abs_error: float  # relative
    rms_error: float  # relative
    median_abs_error_before: float  # with the starting values

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Calibration:
    fields: tuple[FieldFit, ...]
    errors: tuple[KindError, ...]
    gaps: int
    settings: dict[str, float]  # the determined fields' fitted values: what a settings file holds
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "gaps": self.gaps,
            "notes": list(self.notes),
            "settings": self.settings,
            "fields": [f.to_dict() for f in self.fields],
            "errors": [e.to_dict() for e in self.errors],
        }


def _step_shape(step: tuple, group_page_tokens: int) -> tuple[list[tuple[int, int]], list[int]]:
    kind = step[0]
    if kind == "prefill":
        _, new, context, seqs, _ = step
        each, ctx = max(new // seqs, 1), context // seqs
        return [(each, ctx)] * seqs, []
    _, running, tokens, repeat = step
    # the line printed the batch after the last of its `repeat` steps: on average the steps saw (repeat - 1) / 2
    # tokens less per request, and each request's last page is half full
    mean = max(round(tokens / running - group_page_tokens / 2 - (repeat - 1) / 2), 1)
    return [], [mean] * running


class _Model:
    """Gap seconds for a vector of field values (each distinct step priced once per evaluation)."""

    def __init__(self, base: RooflineStepTime, gaps: list[Gap], group_page_tokens: int) -> None:
        self.base = base
        steps = sorted({s for g in gaps for s in g.steps})
        index = {s: i for i, s in enumerate(steps)}
        self.shapes = [_step_shape(s, group_page_tokens) for s in steps]
        self.weights = np.zeros((len(gaps), len(steps)))
        for row, g in enumerate(gaps):
            for s in g.steps:
                self.weights[row, index[s]] += s[-1]  # the step's repeat count
        self.measured = np.array([g.seconds for g in gaps])

    def gap_seconds(self, values: dict[str, float]) -> np.ndarray:
        model = replace(self.base, **values) if values else self.base
        seconds = np.array([model.step_seconds(p, d) for p, d in self.shapes])
        return self.weights @ seconds

    def residuals(self, values: dict[str, float]) -> np.ndarray:
        return self.gap_seconds(values) / self.measured - 1.0


def _scaled(values: dict[str, float], unit: str, factor: float) -> dict[str, float]:
    out = dict(values)
    for f in FIT_UNITS[unit]:
        out[f] = min(values[f] * factor, 1.0) if f.endswith("_eff") else values[f] * factor
    return out


def _jacobian(model: _Model, values: dict[str, float], units: tuple[str, ...]) -> np.ndarray:
    """d(relative error) / d(log unit factor), by central differences of 1 %."""
    cols = []
    for u in units:
        up, down = _scaled(values, u, 1.01), _scaled(values, u, 1 / 1.01)
        cols.append((model.residuals(up) - model.residuals(down)) / (2 * math.log(1.01)))
    return np.array(cols).T


def _select(jac: np.ndarray, names: tuple[str, ...]) -> tuple[list[str], dict[str, float]]:
    influence = np.sqrt((jac**2).mean(axis=0))
    chosen: list[int] = []
    for i in np.argsort(-influence):
        if influence[i] < MIN_INFLUENCE:
            break
        trial = chosen + [int(i)]
        scaled = jac[:, trial] / influence[trial]
        if np.linalg.cond(scaled) <= MAX_CONDITION:
            chosen = trial
    return [names[i] for i in sorted(chosen)], {names[i]: float(influence[i]) for i in range(len(names))}


def _fit(model: _Model, values: dict[str, float], free: list[str]) -> dict[str, float]:
    """``values`` with each unit of ``free`` scaled by its fitted factor (an efficiency stays at most 1)."""
    try:
        from scipy.optimize import least_squares
    except ImportError:
        raise DsakvError("calibrate needs scipy: pip install 'dsakv[calibrate]'") from None
    if not free:
        return values
    # a unit's factor may raise its efficiencies up to 1 at most: log(1 / the largest of them)
    upper = np.array([-math.log(max(values[f] for f in FIT_UNITS[u] if f.endswith("_eff")))
                      if any(f.endswith("_eff") for f in FIT_UNITS[u]) else np.inf for u in free])  # fmt: skip

    def at(x: np.ndarray) -> dict[str, float]:
        out = values
        for u, v in zip(free, x, strict=True):
            out = _scaled(out, u, math.exp(v))
        return out

    sol = least_squares(
        lambda x: model.residuals(at(x)), np.minimum(0.0, upper - 1e-9), bounds=(np.full(len(free), -12.0), upper),
        loss="soft_l1", f_scale=0.05,
    )  # fmt: skip
    return at(sol.x)


def _kind_errors(model: _Model, gaps: list[Gap], before: np.ndarray, after: np.ndarray) -> tuple[KindError, ...]:
    out = []
    for kind in ("decode", "prefill"):
        mask = np.array([g.kind == kind for g in gaps])
        if not mask.any():
            continue
        a, b = after[mask], before[mask]
        out.append(
            KindError(
                kind,
                int(mask.sum()),
                float(np.median(np.abs(a))),
                float(np.sqrt((a**2).mean())),
                float(np.median(np.abs(b))),
            )
        )
    return tuple(out)


def calibrate(facts: LogFacts, base: RooflineStepTime, group_page_tokens: int) -> Calibration:
    """Fit ``base``'s ``FIT_FIELDS`` to the gaps of ``facts`` (see the module's docstring)."""
    if not isinstance(base, RooflineStepTime):
        raise DsakvError("calibrate: fits the roofline step-time model (--step-model roofline)")
    sample = facts.gaps.items
    if len(sample) < MIN_GAPS:
        raise DsakvError(
            f"--log {facts.path}: {len(sample)} measured gaps; calibrate needs at least {MIN_GAPS}: SGLang "
            "'Decode batch' lines with gen throughput (and, with --decode-log-interval 1, 'Prefill batch' lines)"
        )
    stride = max(1, -(-len(sample) // MAX_GAPS))
    gaps = sample[::stride]
    model = _Model(base, gaps, group_page_tokens)
    # the values the model prices with: a field left None is derived (``RooflineStepTime.terms``)
    start = {n: getattr(base.terms, n) if getattr(base, n) is None else getattr(base, n) for n in FIT_FIELDS}
    before = model.residuals(start)
    units = tuple(FIT_UNITS)
    values, free = dict(start), []
    for _ in range(2):  # the second selection is made at the first fit; its fit starts again from the start
        free, _ = _select(_jacobian(model, values, units), units)
        values = _fit(model, start, free)
    _, influence = _select(_jacobian(model, values, units), units)  # reported at the fitted point
    after = model.residuals(values)
    unit_of = {f: u for u, fs in FIT_UNITS.items() for f in fs}
    fields = tuple(
        FieldFit(n, unit_of[n], start[n], values[n], unit_of[n] in free, influence[unit_of[n]]) for n in FIT_FIELDS
    )
    settings = {f.name: f.value for f in fields if f.determined}
    notes = []
    if facts.decode_log_interval > 1:
        notes.append(
            f"decode lines every {facts.decode_log_interval} steps: each covers its steps with the batch it printed; "
            "run the server with --decode-log-interval 1 for a step-exact fit (and prefill lines' gaps)"
        )
    return Calibration(fields, _kind_errors(model, gaps, before, after), len(gaps), settings, tuple(notes))


__all__ = ["FIT_FIELDS", "FIT_UNITS", "Calibration", "FieldFit", "KindError", "calibrate"]
