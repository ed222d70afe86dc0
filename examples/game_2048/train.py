"""Train the 2048 agent: ``python -m examples.game_2048.train``."""

from pathlib import Path

import artsdk as art
from examples.runner import Example, main
from examples.streams import WARMUP, held_out, key

from .agent import MAX_TURNS, REWARDS, asked, play
from .baselines import BASELINES, RANDOM, play_with, random_move
from .game import Board, scenarios


def make_scenarios(n: int, seed: int, cfg: dict):
    """Boards, each played for ``turns`` moves (the config's difficulty knob: fewer on a CPU)."""
    return [art.Args(s, turns=cfg.get("turns", MAX_TURNS)) for s in scenarios(n, seed)]


def no_invalid_move(traj) -> bool:
    """Played every turn (or to the end) without an unreadable or useless move."""
    return traj.outcome.get("invalid") is None


def baselines(held_out: list, cfg: dict, draw: int = 0) -> dict:
    return {name: [play_with(policy, s.args[0], s.kwargs["turns"], draw) for s in held_out]
            for name, policy in BASELINES.items()}


def scripted(games: list, cfg: dict) -> list[dict]:
    """The demonstrator's conversations on these boards, one per move, asked as the agent is
    asked: it plays a random move that changes the board -- legal play, no plan (the supervised
    control trains on these; GRPO has to go beyond them)."""
    out: list[dict] = []

    def seen(board: Board, move: str) -> None:
        out.append({"messages": [*asked(board), {"role": "assistant", "content": move}]})

    for s in games:
        play_with(random_move, s.args[0], s.kwargs["turns"], seen=seen)
    return out


def warmup(cfg: dict) -> list[dict]:
    """The demonstrator's conversations on ``warmup`` boards of their own stream (never held out)."""
    n, banned = cfg.get("warmup", 0), {key(s) for s in held_out(make_scenarios, cfg)}
    return scripted([s for s in make_scenarios(2 * n, WARMUP, cfg) if key(s) not in banned][:n], cfg)


EXAMPLE = Example("game_2048", Path(__file__).with_name("config.toml"), play, REWARDS, make_scenarios,
                  success=no_invalid_move, baselines=baselines, warmup=warmup, scripted=scripted,
                  random_baselines=RANDOM)

if __name__ == "__main__":
    main(EXAMPLE)
