"""The events and metrics extras are optional: without pyzmq, msgspec and prometheus_client, ``import dsakv``,
the engine and the core CLI still work, and only asking for events or metrics needs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"zmq", "msgspec", "prometheus_client"}:
            raise ImportError(f"{name} is blocked for this test")
sys.meta_path.insert(0, Blocker())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_engine_simulator_and_cli_work_without_the_extras():
    code = """
import dsakv
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.cli import main
engine = Engine(EngineConfig(num_pages=8, page_size=4))
engine.generate([[1, 2, 3, 4, 5, 6]], 2)
assert engine.metrics.samples()
assert main(["simulate", "--scenario", "chat", "--scale", "0.02", "--step-model", "constant", "--json"]) == 0
print("ok")
"""
    done = run_blocked(code)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stderr[-2000:]


def test_asking_for_events_without_the_extra_names_the_extra():
    code = """
from dsakv.engine.engine import Engine, EngineConfig
Engine(EngineConfig(num_pages=8, page_size=4, kv_events_endpoint="tcp://127.0.0.1:*"))
"""
    done = run_blocked(code)
    assert done.returncode != 0
    assert "DsakvError: kv_events_endpoint: needs the events extra (pip install 'dsakv[events]')" in done.stderr


def test_simulating_kv_events_on_the_wire_without_the_extra_names_the_extra():
    code = """
from dsakv.cli import main
argv = ["simulate", "--scenario", "chat", "--scale", "0.02", "--instances", "2", "--router", "kv-aware"]
raise SystemExit(main([*argv, "--kv-events-endpoint", "tcp://127.0.0.1:*"]))
"""
    done = run_blocked(code)
    assert done.returncode == 1
    assert done.stderr.strip() == "dsakv: error: router = 'kv-aware': needs msgspec (pip install 'dsakv[events]')"
