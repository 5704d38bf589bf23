"""The manifest of a PD hand-off: everything that gives a page's bytes their meaning, checked field by field.

A prefill side and a decode side exchange manifests before any page moves; the transfer is refused unless
they are equal in every field (``Manifest.check_matches`` names the first field that differs). A page is a
list of **named components** ``(cache, global layer, role)`` with their item length in bytes — never a list
matched by position: SGLang matched its state buffers by position, and a missing or extra buffer shifted
every later one (or, with item length 0, vanished without an error).

Fields (all derived from the ``CacheLayout``, never typed in):

* model fingerprint: blake2b-128 of the spec's canonical JSON (every shape the cache depends on);
* layers, the indexer schedule (which layers own an indexer, which share one) and the MTP (draft) layers;
* row formats: the main-KV dtype, its row bytes and the split latent / scales / RoPE, the indexer key and
  scale bytes and the scale layout (all keys of a page, then all scales);
* page size and ``index_kpool``; the fp8 scales the pool writes with;
* the TP / DCP geometry of the side (rank counts and this side's ranks); protocol version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout

PROTOCOL_VERSION = 1
CACHES = ("main", "indexer")
ROLES = ("target", "draft")
SCALE_LAYOUT = "keys_then_scales"  # inside an indexer page: every state's fp8 key, then every fp32 scale


class TransferError(DsakvError):
    """A hand-off that cannot go on (refused manifest, page-count mismatch, digest mismatch, stale epoch, ...).

    ``reason`` is a short machine-readable tag (``manifest``, ``components``, ``page_count``, ``digest``,
    ``missing``, ``epoch``, ``timeout``, ``aborted``, ``namespace``, ``sender``, ``state``); the message names the
    field or page."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, order=True)
class Component:
    """One named part of a page: ``cache`` ("main" / "indexer"), global cache ``layer``, ``role``
    ("target" for the model's layers, "draft" for MTP layers) and ``item_bytes`` (its bytes per page)."""

    cache: str
    layer: int
    role: str
    item_bytes: int

    @property
    def name(self) -> str:
        return f"{self.cache}:{self.layer}:{self.role}"


def components_of(layout: CacheLayout) -> tuple[Component, ...]:
    """Every component of one page of ``layout``, in the packed block's order (main of each attention
    layer, then indexer of each layer that owns one; shared-indexer layers have no indexer component)."""
    n = layout.spec.num_hidden_layers

    def role(layer: int) -> str:
        return "draft" if layer >= n else "target"

    main = [
        Component("main", lay, role(lay), layout.main_page_bytes_per_layer)
        for lay in range(layout.num_attention_layers)
    ]
    index = [Component("indexer", lay, role(lay), layout.indexer_page_bytes_per_layer) for lay in layout.indexer_layers]
    return tuple(main + index)


def component_offsets(layout: CacheLayout) -> dict[str, int]:
    """Byte offset of each component (by name) inside one packed block of ``layout``."""
    out = {}
    for c in components_of(layout):
        out[c.name] = layout.packed_main_offset(c.layer) if c.cache == "main" else layout.packed_indexer_offset(c.layer)
    return out


def spec_fingerprint(layout: CacheLayout) -> str:
    text = json.dumps(layout.spec.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What one side of a hand-off holds; two sides transfer only when their manifests are equal."""

    protocol_version: int
    model_fingerprint: str
    num_layers: int
    indexer_types: tuple[str, ...]
    mtp_layers: int
    kv_dtype: str
    main_row_bytes: int
    main_split: tuple[int, int, int]  # latent, scale, rope bytes of one main row
    indexer_dtype: str
    indexer_key_bytes: int
    indexer_scale_bytes: int
    scale_layout: str
    page_size: int
    index_kpool: int
    page_bytes: int
    fp8_scales: tuple[str, ...]  # float.hex of each layer's scale
    tp_size: int
    dcp_size: int
    components: tuple[Component, ...]

    @classmethod
    def of(
        cls, layout: CacheLayout, fp8_scales: tuple[float, ...] | None = None, *, tp_size: int = 1, dcp_size: int = 1
    ) -> Manifest:
        for name, value in (("tp_size", tp_size), ("dcp_size", dcp_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DsakvError(f"{name} = {value!r}: must be a positive integer")
        scales = fp8_scales if fp8_scales is not None else (1.0,) * layout.num_attention_layers
        return cls(
            protocol_version=PROTOCOL_VERSION,
            model_fingerprint=spec_fingerprint(layout),
            num_layers=layout.spec.num_hidden_layers,
            indexer_types=tuple(layout.spec.indexer_types),
            mtp_layers=layout.mtp_layers,
            kv_dtype=layout.kv_dtype,
            main_row_bytes=layout.main_row_bytes,
            main_split=(layout.main_latent_bytes, layout.main_scale_bytes, layout.main_rope_bytes),
            indexer_dtype=layout.indexer_dtype,
            indexer_key_bytes=layout.indexer_key_bytes,
            indexer_scale_bytes=layout.indexer_row_bytes - layout.indexer_key_bytes,
            scale_layout=SCALE_LAYOUT,
            page_size=layout.page_size,
            index_kpool=layout.index_kpool,
            page_bytes=layout.page_bytes,
            fp8_scales=tuple(float(s).hex() for s in scales),
            tp_size=tp_size,
            dcp_size=dcp_size,
            components=components_of(layout),
        )

    @property
    def main_bytes_per_page(self) -> int:
        return sum(c.item_bytes for c in self.components if c.cache == "main")

    @property
    def indexer_bytes_per_page(self) -> int:
        return sum(c.item_bytes for c in self.components if c.cache == "indexer")

    def check_matches(self, other: Manifest) -> None:
        """Raise ``TransferError("manifest" | "components", ...)`` naming the first field that differs."""
        if not isinstance(other, Manifest):
            raise TransferError("manifest", f"manifest: got {type(other).__name__}; a peer must send a Manifest")
        # the named fields first, so the message says what differs; the fingerprint (every other shape) last
        names = [f.name for f in fields(self) if f.name not in ("components", "model_fingerprint")]
        for name in names + ["model_fingerprint"]:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise TransferError("manifest", f"manifest field {name}: this side has {mine!r}, the peer {theirs!r}")
            if name == names[-1]:
                check_components(self.components, other.components)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["components"] = [asdict(c) for c in self.components]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """A peer's manifest; a missing or extra field is a refusal, not a default."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise TransferError("manifest", f"manifest: fields {got}; protocol {PROTOCOL_VERSION} has {sorted(names)}")
        values = dict(data)
        try:
            values["components"] = tuple(Component(**c) for c in data["components"])
        except TypeError as exc:
            raise TransferError("components", f"manifest components: {exc}") from None
        for key in ("indexer_types", "main_split", "fp8_scales"):
            values[key] = tuple(values[key])
        return cls(**values)


def check_components(mine: tuple[Component, ...], theirs: tuple[Component, ...]) -> None:
    """Both sides name the same components with the same item length (by name; order is each side's own)."""
    a = {c.name: c for c in mine}
    b = {c.name: c for c in theirs}
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if missing or extra:
        raise TransferError("components", f"components: the peer lacks {missing or 'none'} and adds {extra or 'none'}")
    for name, c in a.items():
        if c.item_bytes != b[name].item_bytes:
            raise TransferError(
                "components", f"component {name}: item length {c.item_bytes} B here, {b[name].item_bytes} B at the peer"
            )


__all__ = ["CACHES", "PROTOCOL_VERSION", "ROLES", "Component", "Manifest", "TransferError", "components_of"]
