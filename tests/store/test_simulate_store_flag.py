"""``dsakv simulate --store URL``: the simulated store's size is checked against (or read from) the real
server's ``maxmemory``, on a real redis-server."""

from __future__ import annotations

import json

from dsakv.cli import main
from tests.cli.cli_checks import assert_one_line_error

SMALL = ["--scenario", "chat", "--scale", "0.05", "--json"]


def test_the_store_size_is_read_from_the_servers_maxmemory(redis_server, capsys):
    client = redis_server.client()
    client.config_set("maxmemory", 2 * 1024**3)
    assert main(["simulate", "--store", redis_server.url, *SMALL]) == 0
    sized = json.loads(capsys.readouterr().out)
    client.config_set("maxmemory", 0)  # no limit: an unbounded store
    assert main(["simulate", "--store", redis_server.url, *SMALL]) == 0
    unbounded = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--store-bytes", "2GiB", *SMALL]) == 0
    same_size = json.loads(capsys.readouterr().out)
    assert sized["hit_tokens_store"] == same_size["hit_tokens_store"]
    assert unbounded["hit_tokens_store"] >= sized["hit_tokens_store"]


def test_a_store_larger_than_the_server_is_refused_in_one_line(redis_server, capsys):
    redis_server.client().config_set("maxmemory", 1024**3)
    code = main(["simulate", "--store", redis_server.url, "--store-bytes", "2GiB", *SMALL])
    assert_one_line_error(code, capsys.readouterr().err, "--store-bytes = 2GiB", "maxmemory")
    code = main(["simulate", "--store", redis_server.url, "--store-bytes", "unbounded", *SMALL])
    assert_one_line_error(code, capsys.readouterr().err, "maxmemory")


def test_an_unreachable_server_is_one_line(redis_server, capsys):
    url = redis_server.url
    redis_server.stop()
    code = main(["simulate", "--store", url, *SMALL])
    assert_one_line_error(code, capsys.readouterr().err, url, "cannot read")
