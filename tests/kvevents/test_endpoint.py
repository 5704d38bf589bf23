"""The tcp port of a KV-events endpoint is ASCII digits only (``str.isdigit`` alone takes full-width digits,
which ``int`` then reads as the ASCII number)."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.kvevents.endpoint import check_instance_endpoints


@pytest.mark.parametrize("port", ["５５５５", "٥٥٥٥", "5５57", "²"])
def test_a_port_of_non_ascii_digits_is_refused(port):
    with pytest.raises(DsakvError, match=r"kv_events_endpoint = .*: a tcp endpoint must end in :PORT, ASCII digits"):
        check_instance_endpoints("kv_events_endpoint", f"tcp://127.0.0.1:{port}", "kv_events_replay_endpoint", None, 1)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5555", "tcp://*:*", "ipc:///tmp/kv"])
def test_ascii_ports_and_free_ports_still_pass(endpoint):
    check_instance_endpoints("kv_events_endpoint", endpoint, "kv_events_replay_endpoint", None, 2)
