"""``dsakv plan``: default run, --json figures, variants, and bad input as one line with exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsakv.cli import build_parser, main
from dsakv.cli.plan import build_plan
from dsakv.planner.deployment import GpuSetting
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def run_json(capsys, *argv: str) -> dict:
    assert main(["plan", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_plan_prints_tables_with_units(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "53,940" in out and "3,452,160" in out and "56,560,189,440" in out
    assert "GB = 10^9 B" in out and "GiB = 2^30 B" in out
    assert "8 x H200, TP 8" in out


def test_json_carries_the_required_figures(capsys):
    d = run_json(capsys)
    assert d["main_bytes_per_token"] == 51_168 and d["indexer_bytes_per_token"] == 2_772
    assert d["cell_bytes"] == 53_940 and d["page_bytes"] == 3_452_160
    assert d["pool_tokens"] == d["pool_pages"] * 64 > 0
    assert [c["tokens"] for c in d["contexts"]] == [8_192, 131_072, 524_288, 1_048_576]
    assert d["contexts"][-1]["total_bytes"] == 56_560_189_440 and d["contexts"][-1]["pages"] == 16_384
    assert d["workspaces"]["topk_buffer_bytes"] == 16 * 2**20
    assert d["workspaces"]["logits_row_bytes_1m"] == 4 * 2**20
    assert d["workspaces"]["mean_tail_waste_bytes"] == 1_726_080
    assert d["workspaces"]["slot_table_bytes_1m"] == 4 * 2**20 and d["workspaces"]["block_table_bytes_1m"] == 65_536


@pytest.mark.parametrize(
    ("argv", "cell"),
    [
        (["--mtp-layers", "1"], 54_728),
        (["--indexer-all-layers"], 61_464),
        (["--model", "deepseek-v3.2"], 48_068),
        (["--kv-dtype", "bf16"], 92_628),
        (["--kpool", "4"], 51_861),
        (["--dcp", "8"], 9_168),
        (["--indexer-pattern", "F" + "S" * 77], 51_168 + 132),
    ],
)
def test_variant_flags_change_the_cell(capsys, argv, cell):
    assert run_json(capsys, *argv)["cell_bytes"] == cell


def test_flag_defaults_are_the_layout_and_gpu_setting_defaults():
    p = build_plan(build_parser().parse_args(["plan"]))
    assert p.layout == CacheLayout(ModelSpec.preset("glm-5.3")) and p.setting == GpuSetting()


def test_available_bytes_sizes_the_pool_directly(capsys):
    d = run_json(capsys, "--available-bytes", str(101 * 3_452_160))
    assert d["pool_pages"] == 100 and d["pool_source"] == "available bytes"


def test_context_and_cached_flags_price_the_request_and_its_whole_cached_pages(capsys):
    d = run_json(capsys, "--available-bytes", "40GB", "--context", "100000", "--cached", "50000")
    assert d["request"]["pages"] == 1_563 == -(-100_000 // 64)
    assert d["prefix_savings"]["cached_pages"] == 781 == 50_000 // 64  # a partial page is not a hit


def test_explain_tokens_of_the_planned_pool_finds_no_gap(capsys):
    logged = run_json(capsys, "--available-bytes", "40GB")["pool_tokens"]
    d = run_json(capsys, "--available-bytes", "40GB", "--explain-tokens", str(logged))
    assert d["explain_tokens"]["gap_tokens"] == 0


def test_gpu_memory_units_are_decimal_and_binary(capsys):
    a = run_json(capsys, "--gpu-memory", "80GiB", "--weights-bytes", "0")
    b = run_json(capsys, "--gpu-memory", str(80 * 2**30), "--weights-bytes", "0")
    assert a["setting"]["gpu_memory_bytes"] == b["setting"]["gpu_memory_bytes"] == 80 * 2**30


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "glm-9"], "model preset = 'glm-9': must be one of"),
        (["--config", "/nonexistent/config.json"], "cannot read"),
        (["--page-size", "32"], "page_size = 32"),
        (["--gpu-memory", "0"], "--gpu-memory"),
        (["--gpu-memory", "-5"], "--gpu-memory"),
        (["--mem-fraction-static", "1.5"], "(0, 1]"),
        (["--mem-fraction-static", "0"], "(0, 1]"),
        (["--kv-dtype", "int4"], "kv_dtype"),
        (["--gpu", "A100"], "gpu"),
        (["--tp", "3"], "tp"),
        (["--context", "abc"], "--context"),
        (["--indexer-pattern", "FSX"], "indexer pattern"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_1(capsys, argv, needle):
    assert main(["plan", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("dsakv: error:")


def test_inconsistent_config_file_is_rejected(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                "index_head_dim": 128, "index_n_heads": 4, "index_topk": 64,
                                "indexer_types": ["full", "shared"]}))  # fmt: skip
    assert main(["plan", "--config", str(path)]) == 1
    assert "indexer_types" in capsys.readouterr().err


def test_console_script_exits_1_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "dsakv", "plan", "--mem-fraction-static", "2"], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


BASE = {"num_hidden_layers": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128,
        "index_n_heads": 4, "index_topk": 64}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({**BASE, "indexer_types": ["full", "shared"]}), "'indexer_types' has 2 entries"),
        (json.dumps({**BASE, "indexer_types": ["full", "half", "full", "full"]}), "'indexer_types'[1] = 'half'"),
        (json.dumps({**BASE, "index_topk_pattern": "FSF"}), "'index_topk_pattern' has 3 entries"),
        (json.dumps({k: v for k, v in BASE.items() if k != "index_head_dim"}), "'index_head_dim'"),
        (json.dumps({**BASE, "kv_lora_rank": "512"}), "'kv_lora_rank'"),
        (json.dumps({**BASE, "quantization_config": "fp8"}), "'quantization_config'"),
    ],
)
def test_bad_config_file_is_one_line_naming_the_field(capsys, tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["plan", "--config", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("dsakv: error:")


def test_plan_help_says_mtp_layers_counts_cache_layers_not_speculative_tokens(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "MTP cache layers (not speculative tokens" in " ".join(capsys.readouterr().out.split())
