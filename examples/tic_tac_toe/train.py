"""Train the tic-tac-toe agent: ``python -m examples.tic_tac_toe.train``."""

from pathlib import Path

from examples.runner import Example, main

from .agent import legal_moves, play, result, tactics
from .baselines import BASELINES, RANDOM, play_with
from .game import scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    return scenarios(n, seed=seed, opponent=cfg.get("opponent", "random"))


def won(traj) -> bool:
    return traj.outcome.get("winner") == "x"


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [play_with(policy, game, draw) for game in held_out] for name, policy in BASELINES.items()}


EXAMPLE = Example("tic_tac_toe", Path(__file__).with_name("config.toml"), play, [result, legal_moves, tactics], make_scenarios,
                  success=won, baselines=baselines, random_baselines=RANDOM)

if __name__ == "__main__":
    main(EXAMPLE)
