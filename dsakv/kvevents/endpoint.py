"""ZMQ endpoint validation, without pyzmq: ``EngineConfig`` and the CLI check an address before anything
loads the ``events`` extra."""

from __future__ import annotations

from dsakv.errors import DsakvError

ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


def check_endpoint(field: str, endpoint: object) -> None:
    """``DsakvError`` naming ``field`` unless ``endpoint`` is a ZMQ endpoint string (tcp, ipc or inproc)."""
    if (
        not isinstance(endpoint, str)
        or not endpoint.startswith(ENDPOINT_SCHEMES)
        or endpoint.endswith("://")
        or any(c.isspace() for c in endpoint)
    ):
        raise DsakvError(f"{field} = {endpoint!r}: must be a ZMQ endpoint such as tcp://127.0.0.1:5557")
