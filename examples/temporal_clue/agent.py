"""The Temporal Clue agent: read the clues, answer in a fixed format."""

from __future__ import annotations

from openai import AsyncOpenAI

import artsdk as art

from .puzzle import generate, parse_answer, score

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "clue-agent"
SIZE = 3


@art.rollout(name="temporal-clue")
async def solve(seed: int) -> dict:
    puzzle = generate(seed, size=SIZE)
    resp = await client.chat.completions.create(
        model=MODEL, max_tokens=48, temperature=1.0,
        messages=[{"role": "system", "content": "You are a careful detective."},
                  {"role": "user", "content": puzzle.prompt()}],
    )
    text = resp.choices[0].message.content or ""
    return {"answer": text, "parsed": parse_answer(text), "solution": list(puzzle.solution),
            "score": score(puzzle, text)}


@art.reward
def correct(traj: art.Trajectory) -> float:
    """Fraction of who / weapon / room / time answered right."""
    return traj.outcome["score"]


REWARDS = [correct]
