"""Where an example's scenarios come from: the held-out set, the warm-up's and each training
step's are separate streams, so no ``--seed`` can turn one into another.

The held-out scenarios are the ones an example makes with the seed ``HELD_OUT`` (and the
warm-up's with ``WARMUP``); a training step's come from a seed hashed from its own name
(``train/<run seed>/<step>/<draw>``), and any held-out scenario such a draw happens to make is
dropped and drawn again. Before, a training step's seed was ``step + 1000 * seed``, and
``--seed 10`` trained its first step on the held-out games.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

HELD_OUT = 10_000  # the seed of the held-out scenarios
WARMUP = HELD_OUT + 1  # the seed of the scripted warm-up's scenarios, where an example has one

Make = Callable[[int, int, dict[str, Any]], list[Any]]  # (how many, seed, config) -> scenarios


def stream_seed(name: str) -> int:
    """The seed of a named stream: 63 bits of its name's SHA-256 (never ``HELD_OUT`` or ``WARMUP``)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1
    return seed if seed not in (HELD_OUT, WARMUP) else seed + 2


def key(scenario: Any) -> str:
    """What makes two scenarios the same one (games by their seed, reviews by their text)."""
    return repr(scenario)


def draw(make: Make, n: int, name: str, cfg: dict[str, Any], excluding: Iterable[Any]) -> list[Any]:
    """``n`` scenarios from the stream ``name``, none of them one of ``excluding``."""
    banned = {key(s) for s in excluding}
    out: list[Any] = []
    for attempt in range(1000):
        for s in make(n, stream_seed(f"{name}/{attempt}"), cfg):
            if key(s) not in banned and len(out) < n:
                out.append(s)
        if len(out) == n:
            return out
    raise RuntimeError(f"could not draw {n} scenarios from {name!r} that are not held out: the example makes "
                       f"too few distinct scenarios")


def training(make: Make, n: int, run_seed: int, step: int, cfg: dict[str, Any], held_out: list[Any]) -> list[Any]:
    """The scenarios of training step ``step`` of the run with seed ``run_seed``: never held out."""
    return draw(make, n, f"train/{run_seed}/{step}", cfg, held_out)


def held_out(make: Make, cfg: dict[str, Any]) -> list[Any]:
    """The held-out scenarios (the config's ``eval_games`` of them)."""
    return make(cfg.get("eval_games", 16), HELD_OUT, cfg)
