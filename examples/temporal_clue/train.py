"""Train the Temporal Clue agent: ``python -m examples.temporal_clue.train``."""

from pathlib import Path

import artsdk as art
from examples.runner import Example, main
from examples.streams import WARMUP, held_out, key

from .agent import REWARDS, SIZE, SYSTEM, solve
from .baselines import BASELINES, RANDOM, play_with, solve as deduce
from .puzzle import generate, scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    """Puzzles of ``size`` suspects, weapons, rooms and times (the difficulty knob)."""
    return [art.Args(s, size=cfg.get("size", SIZE)) for s in scenarios(n, seed)]


def solved(traj) -> bool:
    return traj.outcome.get("score") == 1.0


def baselines(held: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [play_with(policy, s.args[0], s.kwargs["size"], draw) for s in held]
            for name, policy in BASELINES.items()}


def scripted(puzzles: list, cfg: dict) -> list[dict]:
    """The puzzles solved by checking every candidate, written as the answer the agent is asked for."""
    out = []
    for s in puzzles:
        seed, size = s.args[0], s.kwargs["size"]
        out.append({"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": generate(seed, size=size).prompt()},
                                 {"role": "assistant", "content": play_with(deduce, seed, size)["answer"]}]})
    return out


def warmup(cfg: dict) -> list[dict]:
    """``warmup`` scripted solutions of puzzles of their own stream (never held out)."""
    n, banned = cfg.get("warmup", 0), {key(s) for s in held_out(make_scenarios, cfg)}
    return scripted([s for s in make_scenarios(2 * n, WARMUP, cfg) if key(s) not in banned][:n], cfg)


EXAMPLE = Example("temporal_clue", Path(__file__).with_name("config.toml"), solve, REWARDS, make_scenarios,
                  success=solved, baselines=baselines, warmup=warmup, scripted=scripted, random_baselines=RANDOM)

if __name__ == "__main__":
    main(EXAMPLE)
