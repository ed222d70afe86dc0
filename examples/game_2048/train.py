"""Train the 2048 agent: ``python -m examples.game_2048.train``."""

from pathlib import Path

from examples.runner import main

from .agent import REWARDS, play
from .game import scenarios

CONFIG = Path(__file__).with_name("config.toml")

if __name__ == "__main__":
    main(CONFIG, play, REWARDS, lambda n, seed, cfg: scenarios(n, seed))
