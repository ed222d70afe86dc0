"""Temporal Clue: who did it, with what, where and when, deduced from clues, some about
time. Each generated puzzle has exactly one solution (checked by brute force)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Callable

SUSPECTS = ["Alice", "Bob", "Carol", "Dave", "Erin"]
WEAPONS = ["knife", "rope", "candlestick", "wrench", "poison"]
ROOMS = ["kitchen", "library", "garden", "cellar", "study"]
TIMES = ["8pm", "9pm", "10pm", "11pm", "midnight"]
FIELDS = ("suspect", "weapon", "room", "time")

Solution = tuple[str, str, str, str]


@dataclass
class Clue:
    text: str
    holds: Callable[[Solution], bool] = field(repr=False)


@dataclass
class Puzzle:
    seed: int
    suspects: list[str]
    weapons: list[str]
    rooms: list[str]
    times: list[str]
    solution: Solution
    clues: list[str]
    rules: list[Clue] = field(default_factory=list, repr=False)  # the clues as predicates

    def prompt(self) -> str:
        lines = [
            "A crime was committed by exactly one suspect, with one weapon, in one room, at one time.",
            f"Suspects: {', '.join(self.suspects)}. Weapons: {', '.join(self.weapons)}.",
            f"Rooms: {', '.join(self.rooms)}. Times: {', '.join(self.times)}.",
            "Clues:",
            *(f"{i + 1}. {c}" for i, c in enumerate(self.clues)),
            "Answer in exactly this format:",
            "WHO: <suspect>\nWEAPON: <weapon>\nROOM: <room>\nTIME: <time>",
        ]
        return "\n".join(lines)

    def candidates(self) -> list[Solution]:
        return list(itertools.product(self.suspects, self.weapons, self.rooms, self.times))


def _clue_pool(p: Puzzle, rng: random.Random) -> list[Clue]:
    s, w, r, t = p.solution
    order = {x: i for i, x in enumerate(p.times)}
    pool: list[Clue] = []
    for x in p.suspects:
        if x != s:
            pool.append(Clue(f"{x} has an alibi for the whole evening.", lambda c, x=x: c[0] != x))
    for x in p.weapons:
        if x != w:
            pool.append(Clue(f"The {x} was found untouched.", lambda c, x=x: c[1] != x))
    for x in p.rooms:
        if x != r:
            pool.append(Clue(f"Nothing happened in the {x}.", lambda c, x=x: c[2] != x))
    for x in p.times:
        if order[x] < order[t]:
            pool.append(Clue(f"The crime happened after {x}.", lambda c, x=x: order[c[3]] > order[x]))
        elif order[x] > order[t]:
            pool.append(Clue(f"The crime happened before {x}.", lambda c, x=x: order[c[3]] < order[x]))
    for x in p.suspects:  # temporal alibis: where someone was at some time
        for tt in p.times:
            room = r if (x == s and tt == t) else rng.choice(p.rooms)
            pool.append(Clue(
                f"At {tt}, {x} was seen in the {room}.",
                lambda c, x=x, tt=tt, room=room: not (c[0] == x and c[3] == tt and c[2] != room)))
    for x in p.weapons:  # when a weapon was last seen in its place
        for tt in p.times:
            if x == w and order[tt] >= order[t]:
                continue  # the weapon was in use then: this clue would be false
            pool.append(Clue(f"The {x} was still in its place at {tt}.",
                             lambda c, x=x, tt=tt: not (c[1] == x and order[c[3]] <= order[tt])))
    return [c for c in pool if c.holds(p.solution)]


def generate(seed: int, size: int = 4) -> Puzzle:
    """A puzzle with ``size`` suspects, weapons, rooms and times and one solution."""
    rng = random.Random(seed)
    p = Puzzle(seed=seed, suspects=rng.sample(SUSPECTS, size), weapons=rng.sample(WEAPONS, size),
               rooms=rng.sample(ROOMS, size), times=sorted(rng.sample(TIMES, size), key=TIMES.index),
               solution=("", "", "", ""), clues=[])
    p.solution = (rng.choice(p.suspects), rng.choice(p.weapons), rng.choice(p.rooms), rng.choice(p.times))
    pool = _clue_pool(p, rng)
    rng.shuffle(pool)
    left = p.candidates()
    chosen: list[Clue] = []
    for clue in pool:
        kept = [c for c in left if clue.holds(c)]
        if len(kept) < len(left):  # only clues that rule something out
            chosen.append(clue)
            left = kept
        if len(left) == 1:
            break
    assert left == [p.solution], "clue pool could not pin the solution down"
    # drop clues the others make redundant, so every clue matters
    for clue in list(chosen):
        rest = [c for c in chosen if c is not clue]
        if [c for c in p.candidates() if all(k.holds(c) for k in rest)] == [p.solution]:
            chosen = rest
    p.rules = chosen
    p.clues = [c.text for c in chosen]
    return p


def solutions(p: Puzzle, clues: list[Clue]) -> list[Solution]:
    return [c for c in p.candidates() if all(k.holds(c) for k in clues)]


def parse_answer(text: str) -> dict[str, str]:
    """``WHO: Alice`` ... lines -> {"suspect": "alice", ...} (lower case, missing keys left out)."""
    keys = {"who": "suspect", "weapon": "weapon", "room": "room", "time": "time", "when": "time",
            "where": "room"}
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition(":")
        key = keys.get(name.strip().lower())
        if sep and key and key not in out:
            out[key] = value.strip().strip(".").lower()
    return out


def score(p: Puzzle, text: str) -> float:
    """Fraction of the four questions answered right."""
    got = parse_answer(text)
    return sum(got.get(f) == v.lower() for f, v in zip(FIELDS, p.solution)) / 4


def scenarios(n: int, seed: int = 0, size: int = 4) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1 << 30) for _ in range(n)]
