"""The Temporal Clue agent: read the clues, answer in a fixed format."""

from __future__ import annotations

from openai import AsyncOpenAI

import artsdk as art

from .puzzle import generate, parse_answer, score

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "clue-agent"
SIZE = 3
SYSTEM = "You are a careful detective. You answer with four lines: WHO:, WEAPON:, ROOM: and TIME:, and nothing else."


@art.rollout(name="temporal-clue")
async def solve(seed: int, size: int = SIZE, temperature: float = 1.0) -> dict:
    puzzle = generate(seed, size=size)
    resp = await client.chat.completions.create(
        model=MODEL, max_tokens=48, temperature=temperature,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": puzzle.prompt()}],
    )
    text = resp.choices[0].message.content or ""
    return {"answer": text, "parsed": parse_answer(text), "solution": list(puzzle.solution),
            "score": score(puzzle, text)}


@art.reward
def correct(traj: art.Trajectory) -> float:
    """Fraction of who / weapon / room / time answered right."""
    return traj.outcome["score"]


@art.reward(weight=0.2)
def answer_format(traj: art.Trajectory) -> float:
    """Fraction of the four labelled lines present, right or wrong: a small model has to learn
    the format before it can be right."""
    return len(traj.outcome["parsed"]) / 4


REWARDS = [correct, answer_format]
