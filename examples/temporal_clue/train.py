"""Train the Temporal Clue agent: ``python -m examples.temporal_clue.train``."""

from pathlib import Path

import artsdk as art
from examples.runner import Example, main

from .agent import REWARDS, SIZE, solve
from .baselines import BASELINES, play_with
from .puzzle import scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    """Puzzles of ``size`` suspects, weapons, rooms and times (the difficulty knob)."""
    return [art.Args(s, size=cfg.get("size", SIZE)) for s in scenarios(n, seed)]


def solved(traj) -> bool:
    return traj.outcome.get("score") == 1.0


def baselines(held_out: list, cfg: dict) -> dict:
    return {name: [play_with(policy, s.args[0], s.kwargs["size"]) for s in held_out]
            for name, policy in BASELINES.items()}


EXAMPLE = Example("temporal_clue", Path(__file__).with_name("config.toml"), solve, REWARDS, make_scenarios,
                  success=solved, baselines=baselines)

if __name__ == "__main__":
    main(EXAMPLE)
