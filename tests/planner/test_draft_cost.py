"""The MTP draft pass's cost (``dsakv.planner.draft``) at GLM-5.3 scale: what index sharing and the batch
change, in the spec's own numbers. The FLOP formula itself is checked against torch's count of the real
MTP layer in ``tests/model/test_mtp_checkpoints.py``."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.draft import draft_pass_cost, draft_row_flops
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def layout() -> CacheLayout:
    return CacheLayout(ModelSpec.preset("glm-5.3"), mtp_layers=1)


def test_index_share_drops_exactly_the_indexer_scoring_and_its_reads():
    lay, ctx = layout(), 131_072
    spec = lay.spec
    full, shared = draft_pass_cost(lay, [ctx]), draft_pass_cost(lay, [ctx], index_share=True)
    assert full.flops - shared.flops == 2 * spec.index_n_heads * spec.index_head_dim * ctx
    assert full.cache_read_bytes - shared.cache_read_bytes == ctx * lay.indexer_row_bytes
    assert draft_row_flops(lay, ctx) == full.flops


def test_a_row_reads_its_selection_and_context_and_writes_one_row_of_each_cache():
    lay, ctx = layout(), 4096
    cost = draft_pass_cost(lay, [ctx, ctx])
    sel = min(ctx, lay.spec.index_topk)
    assert cost.cache_read_bytes == 2 * (sel * lay.main_row_bytes + ctx * lay.indexer_row_bytes)
    assert cost.cache_write_bytes == 2 * (656 + 132)


def test_more_rows_touch_more_experts_up_to_all_of_them():
    lay = layout()
    one, many = draft_pass_cost(lay, [1000]), draft_pass_cost(lay, [1000] * 512)
    assert one.weight_bytes < many.weight_bytes
    assert many.weight_bytes == draft_pass_cost(lay, [1000] * 1024).weight_bytes  # every expert already read


def test_bad_contexts_are_a_one_line_error():
    with pytest.raises(DsakvError) as err:
        draft_pass_cost(layout(), [0])
    assert "contexts" in str(err.value) and "\n" not in str(err.value)
