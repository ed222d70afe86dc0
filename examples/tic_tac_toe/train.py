"""Train the tic-tac-toe agent: ``python -m examples.tic_tac_toe.train``."""

from pathlib import Path

from examples.runner import main

from .agent import legal_moves, play, result
from .game import scenarios

CONFIG = Path(__file__).with_name("config.toml")


def make_scenarios(n: int, seed: int, cfg: dict):
    return scenarios(n, seed=seed, opponent=cfg.get("opponent", "random"))


def won(traj) -> bool:
    return traj.outcome.get("winner") == "x"


if __name__ == "__main__":
    main(CONFIG, play, [result, legal_moves], make_scenarios, success=won)
