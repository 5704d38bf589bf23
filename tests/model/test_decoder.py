"""The two model classes run one layer loop (``dsakv.model.decoder.PagedDecoder.forward_paged``); their outputs
are pinned by tests/model/test_model.py, test_dsa_checkpoints.py and tests/engine/test_engine_equivalence.py."""

from __future__ import annotations

from dsakv.model.decoder import PagedDecoder, PagedOutput
from dsakv.model.dsa_model import DsaModel
from dsakv.model.tiny_dsa import PagedOutput as TinyPagedOutput
from dsakv.model.tiny_dsa import TinyDsaModel


def test_both_models_run_the_one_paged_layer_loop():
    for model in (TinyDsaModel, DsaModel):
        assert issubclass(model, PagedDecoder)
        assert "forward_paged" not in vars(model) and model.forward_paged is PagedDecoder.forward_paged
    assert TinyPagedOutput is PagedOutput
