"""ModelSpec: every indexer-schedule form, presets against the shared configs, and bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsakv.errors import DsakvError
from dsakv.spec.model_spec import PRESETS, ModelSpec, indexer_types_from_freq, load_spec

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
GLM53_FULL = (0, 1, 2) + tuple(range(6, 78, 4))


def base_config(**extra) -> dict:
    cfg = {
        "num_hidden_layers": 8,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "index_n_heads": 4,
        "index_topk": 64,
    }
    cfg.update(extra)
    return cfg


def test_freq_offset_rule_gives_glm53_full_layers():
    types = indexer_types_from_freq(78, freq=4, offset=3)
    full = tuple(i for i, t in enumerate(types) if t == "full")
    assert full == GLM53_FULL
    assert full[:4] == (0, 1, 2, 6) and full[-1] == 74 and len(full) == 21


def test_every_schedule_form_resolves_to_the_same_types():
    types = ["full", "shared", "full", "shared", "shared", "full", "shared", "shared"]
    pattern = "".join("F" if t == "full" else "S" for t in types)
    explicit = ModelSpec.from_hf_config(base_config(indexer_types=types))
    from_pattern = ModelSpec.from_hf_config(base_config(index_topk_pattern=pattern))
    both = ModelSpec.from_hf_config(base_config(indexer_types=types, index_topk_pattern=pattern))
    assert explicit.indexer_types == from_pattern.indexer_types == both.indexer_types == tuple(types)
    assert explicit.indexer_source == "indexer_types" and from_pattern.indexer_source == "index_topk_pattern"


def test_freq_offset_form_in_a_config():
    spec = ModelSpec.from_hf_config(base_config(num_hidden_layers=78, index_topk_freq=4, index_skip_topk_offset=3))
    assert spec.full_indexer_layers == GLM53_FULL
    assert spec.indexer_source == "index_topk_freq"


def test_no_schedule_means_every_layer_full():
    spec = ModelSpec.from_hf_config(base_config())
    assert spec.num_full_indexer_layers == 8 and spec.num_shared_indexer_layers == 0


@pytest.mark.parametrize(
    ("name", "layers", "full"),
    [
        ("glm-5.3", 78, 21),
        ("glm-5.2", 78, 21),
        ("glm-5.1", 78, 78),
        ("glm-5", 78, 78),
        ("deepseek-v3.2", 61, 61),
        ("tiny", 4, 2),
    ],
)
def test_presets_have_the_documented_schedules(name, layers, full):
    spec = ModelSpec.preset(name)
    assert (spec.num_hidden_layers, spec.num_full_indexer_layers) == (layers, full)
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.index_head_dim) == (512, 64, 128)


def test_indexer_source_layer_points_to_previous_full_layer():
    spec = ModelSpec.preset("glm-5.3")
    assert spec.indexer_source_layer[:8] == (0, 1, 2, 2, 2, 2, 6, 6)


SHARED_CONFIGS = {
    "glm-5.3": "glm-5.3_config.reconstructed.json",
    "glm-5.2": "glm-5.2_config.reconstructed.json",
    "glm-5.1": "glm-5_and_glm-5.1_config.reconstructed.json",
    "glm-5": "glm-5_and_glm-5.1_config.reconstructed.json",
    "deepseek-v3.2": "deepseek-v3.2_config.reconstructed.json",
}


@pytest.mark.parametrize("preset", sorted(SHARED_CONFIGS))
def test_shared_data_configs_parse_to_the_preset_values(preset):
    path = SHARED / "configs" / SHARED_CONFIGS[preset]
    if not path.is_file():
        pytest.skip(f"shared data absent: {path}")
    from_file, shipped = ModelSpec.from_hf_config(path), ModelSpec.preset(preset)
    assert from_file.indexer_types == shipped.indexer_types
    for key in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "index_n_heads",
                "index_topk", "max_position_embeddings", "num_nextn_predict_layers", "weight_dtype"):  # fmt: skip
        assert getattr(from_file, key) == getattr(shipped, key), key
    assert dict(from_file.arch) == dict(shipped.arch)


def test_presets_list_is_complete_and_loadable():
    for name in PRESETS:
        assert ModelSpec.preset(name).name == name


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (base_config(indexer_types=["full"] * 7), "indexer_types"),
        (base_config(indexer_types=["full"] * 7 + ["half"]), "indexer_types"),
        (base_config(index_topk_pattern="FFSX" * 2), "index_topk_pattern"),
        (base_config(index_topk_pattern="FS" * 3), "index_topk_pattern"),
        ({k: v for k, v in base_config().items() if k != "kv_lora_rank"}, "kv_lora_rank"),
        (base_config(index_topk_freq=4, index_skip_topk_offset=0), "index_topk_freq"),
        (base_config(index_topk_freq="4"), "index_topk_freq"),
        (base_config(index_n_heads=0), "index_n_heads"),
        (base_config(num_nextn_predict_layers=-1), "num_nextn_predict_layers"),
        (base_config(indexer_types=["shared"] + ["full"] * 7), "indexer_types"),
    ],
)
def test_bad_config_gives_one_line_error_naming_the_field(cfg, field):
    with pytest.raises(DsakvError) as err:
        ModelSpec.from_hf_config(cfg)
    message = str(err.value)
    assert field in message and "\n" not in message


def test_bad_json_and_unreadable_file_are_one_line_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(DsakvError) as err:
            ModelSpec.from_hf_config(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(DsakvError, match="glm-5.3"):
        load_spec("glm-9")


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(base_config(index_topk_pattern="FSSFSSFS")))
    assert load_spec(config=path).indexer_pattern == "FSSFSSFS"


def test_what_ifs_change_only_the_schedule():
    spec = ModelSpec.preset("glm-5.3")
    assert spec.with_all_indexers_full().num_full_indexer_layers == 78
    assert spec.with_full_indexer_count(39).num_full_indexer_layers == 39
    assert spec.with_full_indexer_count(39).indexer_types[0] == "full"
    with pytest.raises(DsakvError, match="indexer pattern"):
        spec.with_indexer_pattern("FS")
