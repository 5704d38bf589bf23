"""bench/calibrate.py runs on any anchors CSV (here a generated one) and exits 1 when a row leaves its band."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys

import pytest

COLUMNS = (
    "id,model,weight_dtype,gpu,gpus,dp,mtp,accept,kv,mem,n,isl,osl,rate,fixed,conc,cap,chunk,budget,note,src,published"
)


def _write(tmp_path, published: dict) -> str:
    (tmp_path / "traces").mkdir(exist_ok=True)
    lines = [json.dumps({"timestamp": 0.0, "input_length": 100, "output_length": 5, "hash_ids": [i]}) for i in range(4)]
    (tmp_path / "traces" / "tiny-sgl-c2.jsonl").write_text("\n".join(lines) + "\n")
    row = dict.fromkeys(COLUMNS.split(","), "")
    row.update(id="tiny-sgl-c2", model="tiny", gpu="H200", gpus="1", dp="1", mtp="0", kv="fp8_ds_mla", conc="2")
    row.update(chunk="256", published=json.dumps(published))
    path = tmp_path / "anchors.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS.split(","))
        w.writeheader()
        w.writerow(row)
    return str(path)


@pytest.fixture
def calibrate(repo_dir, monkeypatch):
    spec = importlib.util.spec_from_file_location("calibrate", repo_dir / "bench" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "calibrate", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_calibrate_prints_rows_and_exits_by_band(tmp_path, calibrate, capsys):
    probe = _write(tmp_path, {"tpot_ms": [1.0, "mean"], "ttft_ms": [1.0, "p50"], "out_tok_s": 1.0})
    calibrate.main(["--anchors", probe, "--json"])
    ours = {r["metric"]: r["dsakv"] for r in json.loads(capsys.readouterr().out)["rows"]}
    inside = _write(tmp_path, {"tpot_ms": [ours["tpot_ms"] * 1.2, "mean"], "ttft_ms": [ours["ttft_ms"] * 1.9, "p50"]})
    assert calibrate.main(["--anchors", inside, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["metric"] for r in out["rows"]] == ["tpot_ms", "ttft_ms"]
    assert out["rows"][0]["ratio"] == pytest.approx(1.2) and all(r["band_ok"] for r in out["rows"])
    # A rate: dsakv / published; 0.7 is outside 0.75-1.33.
    outside = _write(tmp_path, {"tpot_ms": [ours["tpot_ms"], "mean"], "out_tok_s": ours["out_tok_s"] / 0.7})
    assert calibrate.main(["--anchors", outside]) == 1
    assert "OUT" in capsys.readouterr().out
