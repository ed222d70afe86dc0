"""Train the 2048 agent: ``python -m examples.game_2048.train``."""

from pathlib import Path

from examples.runner import main

from .agent import REWARDS, play
from .game import scenarios

CONFIG = Path(__file__).with_name("config.toml")

def no_invalid_move(traj) -> bool:
    """Played every turn (or to the end) without an unreadable or useless move."""
    return traj.outcome.get("invalid") is None


if __name__ == "__main__":
    main(CONFIG, play, REWARDS, lambda n, seed, cfg: scenarios(n, seed), success=no_invalid_move)
