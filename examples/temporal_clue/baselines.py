"""Simple solvers to judge the trained model against, on the same puzzles and rewards: one
that answers in the right format with a random suspect, weapon, room and time, one that always
answers the first option each list offers, and a scripted one that checks every candidate
against the clues (the puzzle's own solution: the ceiling)."""

from __future__ import annotations

import random
from typing import Callable

from .puzzle import Puzzle, generate, parse_answer, score, solutions


def guess(p: Puzzle, rng: random.Random) -> tuple[str, str, str, str]:
    return rng.choice(p.suspects), rng.choice(p.weapons), rng.choice(p.rooms), rng.choice(p.times)


def first_listed(p: Puzzle, rng: random.Random) -> tuple[str, str, str, str]:
    return p.suspects[0], p.weapons[0], p.rooms[0], p.times[0]


def solve(p: Puzzle, rng: random.Random) -> tuple[str, str, str, str]:
    return solutions(p, p.rules)[0]


def play_with(policy: Callable[[Puzzle, random.Random], tuple[str, str, str, str]], seed: int, size: int,
              draw: int = 0) -> dict:
    """The outcome the rollout would return, had ``policy`` answered (a random policy's choices
    seeded by the puzzle and ``draw``)."""
    p = generate(seed, size=size)
    who, weapon, room, time = policy(p, random.Random(f"{seed}/{draw}"))
    text = f"WHO: {who}\nWEAPON: {weapon}\nROOM: {room}\nTIME: {time}"
    return {"answer": text, "parsed": parse_answer(text), "solution": list(p.solution), "score": score(p, text)}


BASELINES = {"random guess, right format": guess, "always the first listed option": first_listed,
             "checks every candidate (scripted)": solve}
RANDOM = frozenset({"random guess, right format"})  # baselines whose expected value is taken over many draws
