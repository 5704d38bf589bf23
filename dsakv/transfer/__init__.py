"""The PD hand-off's metadata: what crosses from a prefill engine to a decode engine, with no bytes or tensors.

``manifest`` (what both sides must agree on before any page moves, and the named components of a page),
``pages`` (the one page-count function, the per-page digest, the copy spans of a page run), ``state``
(the decode side's transfer state machine: epochs, timeouts, abort with acknowledgement, the commit rule).
The engine's ``pd_*`` modules move the bytes; docs/pd.md describes the protocol.
"""

from dsakv.transfer.manifest import PROTOCOL_VERSION, Component, Manifest, TransferError
from dsakv.transfer.pages import PageCount, page_count, page_digest
from dsakv.transfer.state import POLICIES, Transfer, TransferBook, TransferState

__all__ = [
    "POLICIES",
    "PROTOCOL_VERSION",
    "Component",
    "Manifest",
    "PageCount",
    "Transfer",
    "TransferBook",
    "TransferError",
    "TransferState",
    "page_count",
    "page_digest",
]
