"""A glm_moe_dsa / deepseek_v32 ``config.json`` that leaves fields out gets transformers' defaults in the spec
(``dsakv plan --config``), equal to what transformers' config class fills in; a really invalid value is still a
one-line error, and another model type still needs every required field."""

from __future__ import annotations

import json

import pytest

from dsakv.errors import DsakvError
from dsakv.spec.model_spec import REQUIRED_FIELDS, ModelSpec

transformers = pytest.importorskip("transformers")
CLASSES = {"glm_moe_dsa": "GlmMoeDsaConfig", "deepseek_v32": "DeepseekV32Config"}


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_absent_fields_take_the_transformers_defaults(model_type, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, "num_hidden_layers": 6}))
    spec = ModelSpec.from_hf_config(path)
    ref = getattr(transformers, CLASSES[model_type])(num_hidden_layers=6)
    for field in REQUIRED_FIELDS:
        assert getattr(spec, field) == getattr(ref, field), field
    assert spec.max_position_embeddings == ref.max_position_embeddings
    want_full = [i for i, t in enumerate(getattr(ref, "indexer_types", None) or ["full"] * 6) if t == "full"]
    assert list(spec.full_indexer_layers) == want_full


def test_an_invalid_value_is_still_a_one_line_error():
    with pytest.raises(DsakvError, match=r"^config field 'index_topk' = 0: must be an integer in 1\.\.2\*\*63-1$"):
        ModelSpec.from_hf_config({"model_type": "deepseek_v32", "index_topk": 0})


def test_another_model_type_still_needs_every_required_field():
    with pytest.raises(DsakvError, match="missing required field 'kv_lora_rank'"):
        ModelSpec.from_hf_config({"model_type": "other", "num_hidden_layers": 4})
