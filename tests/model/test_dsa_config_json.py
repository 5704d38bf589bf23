"""``DsaConfig`` reads config.json through ``dsakv.spec.jsonio``, as ``ModelSpec`` does: every way a file can be
wrong is the same one-line ``DsakvError`` through either reader."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.model.dsa_config import DsaConfig
from dsakv.spec.jsonio import MAX_JSON_FILE_BYTES
from dsakv.spec.model_spec import ModelSpec

BAD_FILES = {
    "malformed": (b'{"model_type": "glm_moe_dsa",', "not valid JSON"),
    "duplicate key": (
        b'{"model_type": "glm_moe_dsa", "hidden_size": 64, "hidden_size": 128}',
        "'hidden_size' given twice",
    ),
    "huge number": (b'{"model_type": "glm_moe_dsa", "hidden_size": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    "not UTF-8": (b'{"model_type": "\xff"}', "not UTF-8"),
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "too large": (b" " * (MAX_JSON_FILE_BYTES + 1), "larger than"),
}


def _error(read, path) -> str:
    with pytest.raises(DsakvError) as info:
        read(path)
    return str(info.value)


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_config_json_is_the_same_one_line_error_through_both_readers(tmp_path, case):
    data, expected = BAD_FILES[case]
    path = tmp_path / "config.json"
    path.write_bytes(data)
    via_dsa, via_spec = _error(DsaConfig.from_hf_config, path), _error(ModelSpec.from_hf_config, path)
    assert via_dsa == via_spec
    assert expected in via_dsa and "\n" not in via_dsa and str(path) in via_dsa


def test_a_missing_config_json_is_the_same_error_through_both_readers(tmp_path):
    path = tmp_path / "absent" / "config.json"
    assert _error(DsaConfig.from_hf_config, path) == _error(ModelSpec.from_hf_config, path)
