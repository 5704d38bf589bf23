"""The manifest: derived from the layout, equal or refused naming the field; components by name with lengths."""

from __future__ import annotations

import dataclasses

import pytest

from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.transfer.manifest import Component, Manifest, TransferError, check_components, components_of


def glm53(**kw) -> CacheLayout:
    return CacheLayout(ModelSpec.preset("glm-5.3"), **kw)


def test_glm53_page_has_78_main_and_21_indexer_components_summing_to_the_page():
    lay = glm53()
    comps = components_of(lay)
    main = [c for c in comps if c.cache == "main"]
    index = [c for c in comps if c.cache == "indexer"]
    assert len(main) == lay.spec.num_hidden_layers and len(index) == lay.spec.num_full_indexer_layers
    assert {c.item_bytes for c in main} == {lay.main_page_bytes_per_layer}
    assert {c.item_bytes for c in index} == {lay.indexer_page_bytes_per_layer}
    m = Manifest.of(lay)
    assert m.main_bytes_per_page == lay.main_page_bytes and m.indexer_bytes_per_page == lay.indexer_page_bytes
    assert m.main_bytes_per_page + m.indexer_bytes_per_page == lay.page_bytes


def test_mtp_layers_are_draft_components_with_main_and_indexer():
    lay = glm53(mtp_layers=1)
    draft = [c for c in components_of(lay) if c.role == "draft"]
    n = lay.spec.num_hidden_layers
    assert [(c.cache, c.layer) for c in draft] == [("main", n), ("indexer", n)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(index_kpool=2, page_size=128, allow_any_page_size=True), "page_size"),
        (dict(index_kpool=2, allow_any_page_size=True), "index_kpool"),  # a 32-token indexer page: off CUDA only
        (dict(mtp_layers=1), "mtp_layers"),
        (dict(kv_dtype="bf16"), "kv_dtype"),
    ],
)
def test_a_different_layout_is_refused_naming_the_field(change, field):
    with pytest.raises(TransferError, match=f"manifest field {field}") as err:
        Manifest.of(glm53()).check_matches(Manifest.of(glm53(**change)))
    assert err.value.reason == "manifest"


def test_another_indexer_schedule_or_geometry_is_refused():
    other = CacheLayout(ModelSpec.preset("glm-5.3").with_all_indexers_full())
    with pytest.raises(TransferError, match="indexer_types"):
        Manifest.of(glm53()).check_matches(Manifest.of(other))
    with pytest.raises(TransferError, match="dcp_size"):
        Manifest.of(glm53()).check_matches(Manifest.of(glm53(), dcp_size=2))
    with pytest.raises(TransferError, match="fp8_scales"):
        lay = glm53()
        Manifest.of(lay).check_matches(Manifest.of(lay, (0.5,) * lay.num_attention_layers))


def test_the_json_round_trip_is_equal_and_a_missing_field_is_refused():
    m = Manifest.of(glm53(mtp_layers=1), dcp_size=4)
    again = Manifest.from_json(m.to_json())
    assert again == m
    m.check_matches(again)
    data = m.to_json()
    del data["index_kpool"]
    with pytest.raises(TransferError, match="fields"):
        Manifest.from_json(data)


def test_components_are_matched_by_name_not_position():
    comps = components_of(glm53())
    check_components(comps, tuple(reversed(comps)))  # another order: same components
    dropped = tuple(c for c in comps if c.name != "indexer:6:target")
    with pytest.raises(TransferError, match=r"lacks \['indexer:6:target'\]"):
        check_components(comps, dropped)
    resized = tuple(dataclasses.replace(c, item_bytes=0) if c.cache == "indexer" else c for c in comps)
    with pytest.raises(TransferError, match="item length"):
        check_components(comps, resized)
    assert Component("main", 0, "target", 1).name == "main:0:target"
