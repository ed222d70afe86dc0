"""Train the Temporal Clue agent: ``python -m examples.temporal_clue.train``."""

from pathlib import Path

from examples.runner import main

from .agent import REWARDS, solve
from .puzzle import scenarios

CONFIG = Path(__file__).with_name("config.toml")

def solved(traj) -> bool:
    return traj.outcome.get("score") == 1.0


if __name__ == "__main__":
    main(CONFIG, solve, REWARDS, lambda n, seed, cfg: scenarios(n, seed), success=solved)
