"""Train the Temporal Clue agent: ``python -m examples.temporal_clue.train``."""

from pathlib import Path

import artsdk as art
from examples.runner import HELD_OUT, Example, main

from .agent import REWARDS, SIZE, SYSTEM, solve
from .baselines import BASELINES, play_with, solve as deduce
from .puzzle import generate, scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    """Puzzles of ``size`` suspects, weapons, rooms and times (the difficulty knob)."""
    return [art.Args(s, size=cfg.get("size", SIZE)) for s in scenarios(n, seed)]


def solved(traj) -> bool:
    return traj.outcome.get("score") == 1.0


def baselines(held_out: list, cfg: dict) -> dict:
    return {name: [play_with(policy, s.args[0], s.kwargs["size"]) for s in held_out]
            for name, policy in BASELINES.items()}


def warmup(cfg: dict) -> list[dict]:
    """Puzzles solved by checking every candidate, written as the answer the agent is asked for
    (``warmup`` of them; puzzles neither trained on nor held out)."""
    out = []
    for seed in scenarios(cfg.get("warmup", 0), HELD_OUT + 1):
        p = play_with(deduce, seed, cfg.get("size", SIZE))
        out.append({"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": generate(seed, size=cfg.get("size", SIZE)).prompt()},
                                 {"role": "assistant", "content": p["answer"]}]})
    return out


EXAMPLE = Example("temporal_clue", Path(__file__).with_name("config.toml"), solve, REWARDS, make_scenarios,
                  success=solved, baselines=baselines, warmup=warmup)

if __name__ == "__main__":
    main(EXAMPLE)
