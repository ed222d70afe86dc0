"""Train the email research agent: ``python -m examples.email_agent.train``."""

import random
from pathlib import Path

from examples.runner import main

from .agent import REWARDS, is_correct, judged, questions, research

CONFIG = Path(__file__).with_name("config.toml")


def make_scenarios(n: int, seed: int, cfg: dict):
    qs = questions()
    return random.Random(seed).sample(qs, n)


def rewards(cfg: dict):
    return REWARDS + ([judged(cfg["judge_model"])] if cfg.get("judge_model") else [])


def answered_right(traj) -> bool:
    q = traj.scenario["q"]
    return is_correct(traj.outcome.get("answer"), q.answer if hasattr(q, "answer") else q["answer"])


if __name__ == "__main__":
    main(CONFIG, research, REWARDS, make_scenarios, rewards_for=rewards, success=answered_right)
