"""The agent: label a review in one word. Plain async code calling the OpenAI client."""

from __future__ import annotations

import re

from openai import AsyncOpenAI

import artsdk as art

from .reviews import Review

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "review-agent"


def prompt(review: Review) -> str:
    return f'Review: "{review.text}"\nIs this review positive or negative? Answer with one word.'


@art.rollout(name="reviews")
async def label(review: Review, temperature: float = 1.0) -> str:
    resp = await client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=temperature,
        messages=[{"role": "user", "content": prompt(review)}])
    return resp.choices[0].message.content or ""


def verdict(answer: str) -> tuple[list[str], list[str]]:
    """(every word of the answer, the labels among them in order)."""
    words = re.findall(r"[a-z]+", answer.lower())
    return words, [w for w in words if w in ("positive", "negative")]


def shaped(words: list[str], candidates: list[str], truth: str) -> float:
    """1 for the right answer alone; when it is the first candidate in a longer answer,
    0.5 + 0.5 / (number of words) -- the shorter, the closer to 1, so every group has a
    direction to go; else 0."""
    if words == [truth]:
        return 1.0
    return 0.5 + 0.5 / len(words) if candidates and candidates[0] == truth else 0.0


@art.reward
def correct(traj: art.Trajectory) -> float:
    """The right label, in as few words as possible (see ``shaped``)."""
    words, labels = verdict(traj.outcome or "")
    review = traj.scenario["review"]  # a Review, or its fields when read back from the store
    return shaped(words, labels, review["label"] if isinstance(review, dict) else review.label)


def exact(traj: art.Trajectory) -> bool:
    """Solved: the answer is the right label and nothing else."""
    return correct(traj) == 1.0
