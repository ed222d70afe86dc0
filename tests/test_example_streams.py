"""No ``--seed`` trains on a held-out scenario: the held-out set, the warm-up's and each training
step's come from streams of their own (examples/streams.py). With the old seeds
(``step + 1000 * seed``), ``--seed 10`` trained its first step on exactly the held-out games."""

import importlib
import random

import pytest

from examples import streams
from examples.runner import load_config

NAMES = ["reviews", "tic_tac_toe", "game_2048", "temporal_clue", "email_agent"]
# the seeds a user might pick, the ones that collided before, the far end of the range, and a sample
SEEDS = sorted({0, 1, 2, 9, 10, 11, 99, 100, 999, 1000, 10_000, 123_456, 999_999, 1_000_000,
                *random.Random(0).sample(range(1_000_001), 150)})


def example(name):
    return importlib.import_module(f"examples.{name}.train").EXAMPLE


@pytest.mark.parametrize("name", NAMES)
def test_no_seed_up_to_a_million_draws_a_held_out_scenario(name, monkeypatch):
    ex = example(name)
    cfg = load_config(ex.config, [])
    held = {streams.key(s) for s in streams.held_out(ex.make_scenarios, cfg)}
    assert len(held) == cfg["eval_games"]
    steps = cfg["steps"] + 1
    for seed in SEEDS:
        for step in range(steps):
            drawn = streams.training(ex.make_scenarios, cfg["scenarios_per_step"], seed, step, cfg,
                                     list(streams.held_out(ex.make_scenarios, cfg)))
            assert len(drawn) == cfg["scenarios_per_step"]
            assert not {streams.key(s) for s in drawn} & held, (name, seed, step)
    if ex.warmup is None:
        return
    # nor does the warm-up's stream hold one
    cfg_warm = {**cfg, "warmup": cfg.get("warmup", 16)}
    if name in ("tic_tac_toe", "game_2048"):
        # a game's positions recur in other games (every one opens on the empty board): the games differ
        games = []
        monkeypatch.setattr(importlib.import_module(f"examples.{name}.train"), "scripted",
                            lambda scenarios, c: games.extend(scenarios) or [])
        ex.warmup(cfg_warm)
        assert len(games) == cfg_warm["warmup"] and not {streams.key(s) for s in games} & held
    else:  # a conversation is its scenario
        assert not {m["messages"][1]["content"] for m in ex.warmup(cfg_warm)} & {
            m["messages"][1]["content"] for m in ex.scripted(streams.held_out(ex.make_scenarios, cfg), cfg)}


def test_the_old_seeds_did_leak_and_the_held_out_set_is_the_documented_one():
    ex = example("tic_tac_toe")
    cfg = load_config(ex.config, [])
    held = streams.held_out(ex.make_scenarios, cfg)
    # what the runner drew for --seed 10, step 0, before: the held-out games themselves
    old = ex.make_scenarios(cfg["scenarios_per_step"], 0 + 1000 * 10, cfg)
    assert [g.seed for g in old] == [g.seed for g in held[:len(old)]]
    assert held == ex.make_scenarios(cfg["eval_games"], 10_000, cfg)  # the held-out games did not change


def test_a_drawn_held_out_scenario_is_dropped_and_drawn_again():
    def make(n, seed, cfg):  # a tiny scenario space: half the draws are held out
        rng = random.Random(seed)
        return [rng.randrange(4) for _ in range(n)]

    held = [0, 1]
    for step in range(50):
        drawn = streams.training(make, 6, 10, step, {}, held)
        assert len(drawn) == 6 and set(drawn) <= {2, 3}
    with pytest.raises(RuntimeError, match="too few distinct scenarios"):
        streams.training(make, 3, 0, 0, {}, [0, 1, 2, 3])
