"""Config semantics equal transformers' (5.24) for glm_moe_dsa and deepseek_v32: defaults, precedence
indexer_types -> index_topk_pattern -> freq/offset, and DeepSeek-V3.2 running every layer full."""

from __future__ import annotations

import itertools
import json

import pytest

from dsakv.errors import DsakvError
from dsakv.spec.model_spec import ModelSpec

transformers = pytest.importorskip("transformers")

BASE = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_n_heads": 4, "index_topk": 64}


def reference_types(**kwargs) -> list[str]:
    return list(transformers.GlmMoeDsaConfig(**kwargs).indexer_types)


@pytest.mark.parametrize("layers", [1, 4, 9, 78])
def test_freq_offset_schedule_equals_glm_config_for_every_combination(layers):
    for freq, offset in itertools.product([None, 1, 2, 3, 4], [None, 1, 2, 3]):
        kw = {k: v for k, v in (("index_topk_freq", freq), ("index_skip_topk_offset", offset)) if v is not None}
        want = reference_types(num_hidden_layers=layers, **kw)
        if want[0] != "full":
            continue
        spec = ModelSpec.from_hf_config({**BASE, "model_type": "glm_moe_dsa", "num_hidden_layers": layers, **kw})
        assert list(spec.indexer_types) == want, (layers, freq, offset)


def test_freq_alone_takes_transformers_offset_default():
    spec = ModelSpec.from_hf_config({**BASE, "num_hidden_layers": 8, "index_topk_freq": 4})
    assert list(spec.indexer_types) == reference_types(num_hidden_layers=8, index_topk_freq=4)


def test_indexer_types_win_over_pattern_and_pattern_over_freq():
    types = ["full", "shared"] * 4
    cfg = {
        **BASE,
        "num_hidden_layers": 8,
        "indexer_types": types,
        "index_topk_pattern": "FFFFFFFF",
        "index_topk_freq": 4,
    }
    assert list(ModelSpec.from_hf_config(cfg).indexer_types) == types
    cfg = {**BASE, "num_hidden_layers": 8, "index_topk_pattern": "FSSFSSFS", "index_topk_freq": 4}
    assert ModelSpec.from_hf_config(cfg).indexer_pattern == "FSSFSSFS"
    assert reference_types(num_hidden_layers=8, index_topk_pattern="FSSFSSFS", index_topk_freq=4) == [
        "full" if c == "F" else "shared" for c in "FSSFSSFS"
    ]


def test_deepseek_v32_config_runs_every_layer_full():
    cfg = {**BASE, "model_type": "deepseek_v32", "num_hidden_layers": 6, "index_topk_freq": 4}
    assert ModelSpec.from_hf_config(cfg).num_full_indexer_layers == 6


def test_saved_config_json_gives_the_reference_schedule(tmp_path):
    cfg = transformers.GlmMoeDsaConfig(num_hidden_layers=10, index_topk_freq=3, index_skip_topk_offset=2)
    cfg.save_pretrained(tmp_path)
    spec = ModelSpec.from_hf_config(tmp_path / "config.json")
    assert list(spec.indexer_types) == list(cfg.indexer_types)
    transformers.DeepseekV32Config(num_hidden_layers=5).save_pretrained(tmp_path / "ds")
    assert ModelSpec.from_hf_config(tmp_path / "ds" / "config.json").num_full_indexer_layers == 5


@pytest.mark.parametrize("cfg", [{"indexer_types": ["shared", "full"]}, {"index_topk_pattern": "FFF"}])
def test_schedules_that_cannot_run_are_one_line_errors(cfg):
    with pytest.raises(DsakvError) as err:
        ModelSpec.from_hf_config({**BASE, "num_hidden_layers": 2, **cfg})
    assert "\n" not in str(err.value)


def test_plan_bf16_works_for_kv_lora_rank_not_512(tmp_path, capsys):
    from dsakv.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "model_type": "glm_moe_dsa", "num_hidden_layers": 6, "kv_lora_rank": 96,
                                "index_topk_freq": 2}))  # fmt: skip
    assert main(["plan", "--config", str(path), "--kv-dtype", "bf16", "--available-bytes", "1000000000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["full_indexer_layers"] == [0, 1, 3, 5]
