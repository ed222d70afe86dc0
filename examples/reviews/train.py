"""Train the review labeller: ``python -m examples.reviews.train`` (``make demo``)."""

from pathlib import Path

from examples.runner import Example, main

from .agent import correct, exact, label
from .baselines import BASELINES
from .reviews import reviews

REWARDS = [correct]


def make_scenarios(n: int, seed: int, cfg: dict):
    return reviews(n, seed)


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [policy(review) for review in held_out] for name, policy in BASELINES.items()}


EXAMPLE = Example("reviews", Path(__file__).with_name("config.toml"), label, REWARDS, make_scenarios, success=exact,
                  baselines=baselines)
CONFIG = EXAMPLE.config

if __name__ == "__main__":
    main(EXAMPLE)
