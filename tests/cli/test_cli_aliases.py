"""The old flag spellings (``dsakv.cli.aliases``) still parse, to the very config their new names give, and stay
out of ``--help``; the old sweep keys name the new fields."""

from __future__ import annotations

import pytest

from dsakv.cli import build_parser
from dsakv.cli.simulate import build_config
from dsakv.cli.sweep_args import parse_sweep
from dsakv.sim.config import SimConfig

ENDPOINT, REPLAY = "tcp://127.0.0.1:7100", "tcp://127.0.0.1:7200"
# (old spelling, new spelling, value, the SimConfig field and the value it holds)
SIMULATE_ALIASES = [
    ("--mtp", "--num-speculative-tokens", "3", "num_speculative_tokens", 3),
    ("--indexer", "--indexer-pattern", "39", "indexer_pattern", "39"),
    ("--write-threshold", "--hit-threshold", "5", "hit_threshold", 5),
]


def _config(argv: list[str]) -> SimConfig:
    cfg, _ = build_config(build_parser().parse_args(["simulate", *argv]))
    return cfg


@pytest.mark.parametrize(
    ("old", "new", "value", "field", "want"), SIMULATE_ALIASES, ids=[a[0] for a in SIMULATE_ALIASES]
)
def test_simulate_old_flag_parses_to_the_same_config_as_the_new(old, new, value, field, want):
    by_old, by_new = _config([old, value]), _config([new, value])
    assert by_old == by_new and getattr(by_new, field) == want != getattr(SimConfig(), field)


def test_simulate_old_kv_events_flags_parse_to_the_same_config():
    router = ["--router", "kv-aware", "--instances", "2"]
    old = _config([*router, "--kv-events", ENDPOINT, "--kv-events-replay", REPLAY])
    new = _config([*router, "--kv-events-endpoint", ENDPOINT, "--kv-events-replay-endpoint", REPLAY])
    assert old == new and (new.kv_events_endpoint, new.kv_events_replay_endpoint) == (ENDPOINT, REPLAY)


def test_a_flag_left_out_keeps_its_default_under_an_alias():
    assert _config([]) == SimConfig()  # the aliases add no default of their own


@pytest.mark.parametrize("command", ["demo", "generate"])
def test_demo_and_generate_take_mtp_as_num_speculative_tokens(command):
    parser = build_parser()
    old = parser.parse_args([command, "--mtp", "2"])
    assert (
        old.num_speculative_tokens
        == parser.parse_args([command, "--num-speculative-tokens", "2"]).num_speculative_tokens
        == 2
    )
    assert parser.parse_args([command]).num_speculative_tokens is None


def test_demo_old_kv_events_flags_set_the_endpoints():
    args = build_parser().parse_args(["demo", "--kv-events", ENDPOINT, "--kv-events-replay", REPLAY])
    assert (args.kv_events_endpoint, args.kv_events_replay_endpoint) == (ENDPOINT, REPLAY)


@pytest.mark.parametrize("command", ["simulate", "demo", "generate", "calibrate"])
def test_help_shows_only_the_new_spellings(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert "--num-speculative-tokens" in text
    for old in ("--mtp ", "--indexer ", "--write-threshold", "--kv-events ", "--kv-events-replay "):
        assert old not in text


def test_old_sweep_keys_name_the_new_fields():
    assert parse_sweep(["mtp=0,2", "indexer=39"], SimConfig()) == parse_sweep(
        ["num_speculative_tokens=0,2", "indexer_pattern=39"], SimConfig()
    )
