"""Train the review labeller: ``python -m examples.reviews.train`` (``make demo``)."""

from pathlib import Path

from examples.runner import main

from .agent import correct, exact, label
from .reviews import reviews

CONFIG = Path(__file__).with_name("config.toml")
REWARDS = [correct]


def make_scenarios(n: int, seed: int, cfg: dict):
    return reviews(n, seed)


if __name__ == "__main__":
    main(CONFIG, label, REWARDS, make_scenarios, success=exact)
