"""bench/measured_ops.py: dsakv's price of single operations beside AIConfigurator's measured SGLang tables
(bench/calibration/aiconfigurator, committed), at a calibration row's shapes."""

from __future__ import annotations

import csv
import re

import pytest

from dsakv.sim.config import build_setup


@pytest.fixture
def measured_ops(load_file_module, repo_dir):
    return load_file_module(repo_dir / "bench" / "measured_ops.py")


def test_a_curve_interpolates_between_measured_points_and_never_beyond_them(measured_ops):
    c = measured_ops.Curve()
    for size, seconds in ((10, 1.0), (20, 3.0), (20, 5.0), (40, 9.0)):
        c.add(size, seconds)
    assert (c.at(10), c.at(20), c.at(15), c.at(30)) == (1.0, 4.0, 2.5, 6.5)  # repeats averaged
    assert c.at(9) is None and c.at(41) is None and measured_ops.Curve().at(1) is None


def _table_curve(path, gpu, version, gpus, size):
    """The all-reduce table's latency at ``size`` elements, interpolated here without the script's code."""
    pts = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            if (r["gpu"], r["version"], r["op"], r["gpus"]) == (gpu, version, "all_reduce", str(gpus)):
                pts.setdefault(int(r["message_elements"]), []).append(float(r["latency_us"]))
    xs = sorted(pts)
    lo = max(x for x in xs if x <= size)
    hi = min(x for x in xs if x >= size)
    y0, y1 = (sum(pts[x]) / len(pts[x]) for x in (lo, hi))
    return y0 if lo == hi else y0 + (y1 - y0) * (size - lo) / (hi - lo)


def test_an_sglang_row_is_compared_op_by_op_and_another_engines_row_says_why_not(measured_ops, repo_dir, capsys):
    check = repo_dir / "bench" / "calibration" / "check.csv"
    sgl, vllm = "glm52-sgl-b200-tp8-mtp5-8k1k-c1", "glm52-vllm-tp8-8k1k-c512"
    assert measured_ops.main(["--anchors", str(check), "--only", f"{sgl},{vllm}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[lines.index(next(x for x in lines if x.startswith(vllm))) + 1] == (
        "  no comparison: the tables are SGLang's kernels"
    )
    assert lines[-1].startswith("measured ops over 2 rows, measured / dsakv geometric mean")
    assert " all_reduce " in lines[-1] and " moe " in lines[-1]

    # the all-reduce line of one token: dsakv's formula and the table's figure, each computed here
    with check.open(newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == sgl)
    model = build_setup(measured_ops.calibrate.sim_config(row)).step_time
    r, tp = model.rank, model.tp
    price = r.hidden * 2 * 2 * (tp - 1) / tp / r.link_bw + model.gpu.link_latency_s
    table = repo_dir / "bench" / "calibration" / "aiconfigurator" / "collectives.csv"
    measured = _table_curve(table, "B200", "sglang 0.5.14", tp, r.hidden) * 1e-6
    line = next(x for x in lines if re.match(r"  all_reduce 1 +dsakv .* sglang 0\.5\.14 ", x))
    numbers = [float(v) for v in re.findall(r"(\d+\.\d+) us", line)]
    assert numbers == [round(price * 1e6, 1), round(measured * 1e6, 1)]
    assert line.endswith(f"ratio {measured / price:5.2f}")


def test_a_row_the_replay_cannot_build_is_one_error_line(measured_ops, repo_dir, capsys, tmp_path):
    fit = repo_dir / "bench" / "calibration" / "fit.csv"
    with fit.open(newline="") as f:
        rows = list(csv.DictReader(f))
    broken = dict(rows[0], id="too-big", gpus="1")  # the whole model on one GPU: no room for a pool
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(broken)
    assert measured_ops.main(["--anchors", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("too-big: ") and lines[1].startswith("  error: ") and "pool" in lines[1]
    assert lines[-1].endswith(": none")
