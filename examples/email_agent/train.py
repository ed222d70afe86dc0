"""Train the email research agent: ``python -m examples.email_agent.train``.

The 135M model never writes a tool call on its own, so a run starts with a supervised warm-up
on the scripted researcher's conversations (``warmup`` in config.toml: how many), then GRPO
on questions it has not seen; the held-out questions are never trained on, in either.
"""

import random
from pathlib import Path

from examples.runner import Example, main
from examples.streams import HELD_OUT

from .agent import REWARDS, is_correct, judged, questions, research
from .baselines import BASELINES, warmup_conversations
from .inbox import Question


def split(qs: list[Question]) -> tuple[list[Question], list[Question], list[Question]]:
    """(held out, warm-up, reinforcement) questions: one in four held out, a fixed few of the
    rest for the warm-up, the others for GRPO."""
    held = [q for q in qs if q.id % 4 == 0]
    rest = [q for q in qs if q.id % 4]
    return held, rest[:48], rest[48:]


def make_scenarios(n: int, seed: int, cfg: dict):
    held, _, train = split(questions())
    return random.Random(seed).sample(held if seed == HELD_OUT else train, n)


def warmup(cfg: dict) -> list[dict]:
    return warmup_conversations(split(questions())[1][:cfg.get("warmup", 16)])


def rewards(cfg: dict):
    judge = [judged(cfg["judge_model"], cfg.get("judge_base_url"))] if cfg.get("judge_model") else []
    return REWARDS + judge


def answered_right(traj) -> bool:
    q = traj.scenario["q"]
    return is_correct(traj.outcome.get("answer"), q.answer if hasattr(q, "answer") else q["answer"])


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [policy(q) for q in held_out] for name, policy in BASELINES.items()}


def scripted(qs: list, cfg: dict) -> list[dict]:
    """The scripted researcher's conversations on these questions (the --control sft run's data)."""
    return warmup_conversations(qs)


EXAMPLE = Example("email_agent", Path(__file__).with_name("config.toml"), research, REWARDS, make_scenarios,
                  success=answered_right, baselines=baselines, rewards_for=rewards, warmup=warmup, scripted=scripted)

if __name__ == "__main__":
    main(EXAMPLE)
