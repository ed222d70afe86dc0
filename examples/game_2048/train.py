"""Train the 2048 agent: ``python -m examples.game_2048.train``."""

from pathlib import Path

import artsdk as art
from examples.runner import Example, main

from .agent import MAX_TURNS, REWARDS, play
from .baselines import BASELINES, RANDOM, play_with
from .game import scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    """Boards, each played for ``turns`` moves (the config's difficulty knob: fewer on a CPU)."""
    return [art.Args(s, turns=cfg.get("turns", MAX_TURNS)) for s in scenarios(n, seed)]


def no_invalid_move(traj) -> bool:
    """Played every turn (or to the end) without an unreadable or useless move."""
    return traj.outcome.get("invalid") is None


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [play_with(policy, s.args[0], s.kwargs["turns"], draw) for s in held_out]
            for name, policy in BASELINES.items()}


EXAMPLE = Example("game_2048", Path(__file__).with_name("config.toml"), play, REWARDS, make_scenarios,
                  success=no_invalid_move, baselines=baselines, random_baselines=RANDOM)

if __name__ == "__main__":
    main(EXAMPLE)
