"""The constants table of docs/steptime.md is complete: every constant the step time (and the calibration replay) uses
has a row, at most three are fitted, and each fitted one is an efficiency (a fraction of a peak), not a time."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from dsakv.planner.gpus import GpuKind
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.fitted import FITTED, NCCL_NVLINK_BUS_EFF
from dsakv.sim.steptime.kernels import GEMM_STREAM_EFF

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("source", "derived", "fitted", "engine", "input", "implementation")
# GpuKind fields the step time prices with (the rest is memory, labels and the host link: docs/planner.md, tiers.md)
GPU_SPEEDS = ("bf16_flops", "fp8_flops", "hbm_bytes_per_s", "link_bytes_per_s", "link_latency_s", "mla_head_pad")
GPU_SPEEDS += ("arch", "kernel_node_s", "sm_count")
# RooflineStepTime's fields that describe the deployment or the model, not a constant
DEPLOYMENT = ("layout", "gpu", "tp", "dp_attention", "dcp", "ep", "moe_a2a", "weight_dtype", "has_indexer")
DEPLOYMENT += ("num_draft_tokens", "num_speculative_tokens", "mtp_index_share")


def _section(title: str) -> str:
    """The text under ``title`` up to the next heading of any level."""
    text = (ROOT / "docs" / "steptime.md").read_text()
    start = text.index(title) + len(title)
    ends = [e for e in (text.find("\n## ", start), text.find("\n### ", start)) if e != -1]
    return text[start : min(ends) if ends else None]


def table(title: str) -> dict[str, str]:
    """name -> kind for every backticked name in the first cell of the table under ``title``."""
    out = {}
    for line in _section(title).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        kind = cells[1].replace("*", "").split(" ")[0]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            out[name] = kind
    return out


def module_constants(path: Path) -> set[str]:
    """Upper-case names a module assigns at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Name) and t.id.isupper():
                names.add(t.id)
    return names


@pytest.fixture(scope="module")
def steptime_table():
    return table("### Step-time constants")


def test_every_step_time_constant_has_a_row(steptime_table):
    wanted = set()
    for path in (ROOT / "dsakv" / "sim" / "steptime").glob("*.py"):
        wanted |= module_constants(path)
    wanted |= {f.name for f in dataclasses.fields(RooflineStepTime) if f.init and f.name not in DEPLOYMENT}
    wanted |= set(GPU_SPEEDS) | {"RRZE_H200_GRAPH_64KB_GBPS", "H200_GRAPH_KERNEL_NODE_S"}
    missing = sorted(wanted - set(steptime_table))
    assert not missing, f"constants without a row in docs/steptime.md's Constants table: {missing}"
    assert set(GPU_SPEEDS) <= {f.name for f in dataclasses.fields(GpuKind)}
    assert all(kind in KINDS for kind in steptime_table.values()), steptime_table


def test_at_most_three_constants_are_fitted_and_each_is_an_efficiency(steptime_table):
    fitted = sorted(name for name, kind in steptime_table.items() if kind == "fitted")
    # a fitted row names the field and its module constant: bw_eff (BW_EFF)
    fields = [n for n in fitted if n.islower()]
    assert sorted(fields) == sorted(FITTED) and len(FITTED) <= 3
    for name, value in FITTED.items():
        assert name.endswith("_eff") and 0 < value <= 1  # a fraction of a datasheet peak, not seconds
        assert getattr(RooflineStepTime, name) == value  # the default the model prices with
    # each below the published measurement that bounds it
    assert FITTED["bw_eff"] <= GEMM_STREAM_EFF and FITTED["link_eff"] <= NCCL_NVLINK_BUS_EFF


def test_no_time_in_the_step_time_is_fitted():
    # Every field in seconds defaults to None: derived per GPU kind (figures.step_terms), never a typed-in time.
    seconds = [f for f in dataclasses.fields(RooflineStepTime) if f.name.endswith("_s")]
    assert seconds and all(f.default is None for f in seconds)


def test_every_replay_constant_has_a_row():
    rows = table("### Replay constants")
    missing = sorted(module_constants(ROOT / "bench" / "calibrate.py") - set(rows))
    assert not missing, f"bench/calibrate.py constants without a row in docs/steptime.md: {missing}"
    assert all(kind in KINDS for kind in rows.values()), rows


def test_the_table_catches_a_constant_without_a_row(tmp_path, steptime_table):
    # The check above is real: a new module constant is found and reported.
    probe = tmp_path / "probe.py"
    probe.write_text("NEW_EFF = 0.5\nlower = 1\n")
    assert module_constants(probe) - set(steptime_table) == {"NEW_EFF"}
