"""Train the tic-tac-toe agent: ``python -m examples.tic_tac_toe.train``."""

from pathlib import Path

from examples.runner import Example, main
from examples.streams import WARMUP, held_out, key

from .agent import asked, legal_moves, play, result, tactics
from .baselines import BASELINES, RANDOM, play_with, random_cell
from .game import Game, scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    return scenarios(n, seed=seed, opponent=cfg.get("opponent", "random"))


def won(traj) -> bool:
    return traj.outcome.get("winner") == "x"


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [play_with(policy, game, draw) for game in held_out] for name, policy in BASELINES.items()}


def scripted(games: list, cfg: dict) -> list[dict]:
    """The demonstrator's conversations on these games, one per move, asked as the agent is
    asked: it plays a random legal cell -- legal play, no tactics (the supervised control
    trains on these; GRPO has to go beyond them)."""
    out: list[dict] = []

    def seen(game: Game, move: str) -> None:
        out.append({"messages": [*asked(game), {"role": "assistant", "content": move}]})

    for game in games:
        play_with(random_cell, game, seen=seen)
    return out


def warmup(cfg: dict) -> list[dict]:
    """The demonstrator's conversations on ``warmup`` games of their own stream (never held out)."""
    n, banned = cfg.get("warmup", 0), {key(s) for s in held_out(make_scenarios, cfg)}
    return scripted([s for s in make_scenarios(2 * n, WARMUP, cfg) if key(s) not in banned][:n], cfg)


EXAMPLE = Example("tic_tac_toe", Path(__file__).with_name("config.toml"), play, [result, legal_moves, tactics],
                  make_scenarios, success=won, baselines=baselines, warmup=warmup, scripted=scripted,
                  random_baselines=RANDOM)

if __name__ == "__main__":
    main(EXAMPLE)
