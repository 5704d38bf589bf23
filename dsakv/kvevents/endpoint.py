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


def instance_endpoint(endpoint: str, instance: int) -> str:
    """The address instance ``instance`` of a cluster binds when every instance publishes from one given
    address, as vLLM offsets its DP ranks' ports: instance 0 binds ``endpoint`` itself; instance ``i`` the tcp
    port + ``i`` (a ``*`` port stays ``*``: each binds a free one), or an ipc / inproc name + ``-i``."""
    if instance == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return endpoint if port == "*" else f"{host}:{int(port) + instance}"
    return f"{endpoint}-{instance}"


def check_instance_endpoints(field: str, endpoint: str, replay_field: str, replay: str | None, instances: int) -> None:
    """``DsakvError`` unless ``instances`` instances can bind ``endpoint`` (and ``replay``) offset as
    ``instance_endpoint`` does: a tcp address names its port (``:*`` for free ones), the offset ports stay
    below 65536, and no instance's address is another's (or its own replay socket's)."""
    named = [(field, endpoint)] + ([(replay_field, replay)] if replay is not None else [])
    taken: dict[str, str] = {}
    for name, address in named:
        check_endpoint(name, address)
        if address.startswith("tcp://"):
            host, _, port = address[len("tcp://") :].rpartition(":")
            if not host or not (port == "*" or (port.isascii() and port.isdigit())):
                raise DsakvError(
                    f"{name} = {address!r}: a tcp endpoint must end in :PORT, ASCII digits (or :* for free ports)"
                )
            if port != "*" and int(port) + instances - 1 > 65535:
                raise DsakvError(
                    f"{name} = {address!r}: {instances} instances bind ports {port} to {int(port) + instances - 1}, "
                    "past 65535"
                )
            if port == "*":
                continue
        for i in range(instances):
            bound = instance_endpoint(address, i)
            if bound in taken:
                raise DsakvError(
                    f"{name} = {address!r}: instance {i} would bind {bound}, which {taken[bound]} binds; with "
                    f"{instances} instances the PUB and replay addresses need {instances} ports each, apart"
                )
            taken[bound] = f"{name} of instance {i}"
