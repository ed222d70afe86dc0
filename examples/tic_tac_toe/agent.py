"""The agent: plain async code calling the OpenAI client, decorated for artsdk."""

from __future__ import annotations

import random
import re

from openai import AsyncOpenAI

import artsdk as art

from .game import CELLS, Game, opponent_move

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "ttt-agent"
SYSTEM = ("You play tic-tac-toe as X against O: three in a row wins. Cells are named by row letter and "
          "column number, A1 to C3. Answer with the one free cell you play, like B2, and nothing else.")
_CELL = re.compile(r"([ABCabc])\s?([123])")


def parse_move(text: str) -> str | None:
    """The first cell named in the answer (``"b2"``, ``"I play B2."`` -> ``"B2"``)."""
    m = _CELL.search(text or "")
    return (m.group(1).upper() + m.group(2)) if m else None


def asked(game: Game) -> list[dict]:
    """What the agent is asked each turn: the board, what it threatens, the free cells."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Board:\n{game.render()}\n{game.threats()}Free: {' '.join(game.free())}\n"
                                        f"Your move:"}]


@art.rollout(name="tic-tac-toe")
async def play(game: Game, temperature: float = 1.0) -> dict:
    game = Game(seed=game.seed, opponent=game.opponent)  # a fresh board each rollout
    rng = random.Random(game.seed)
    moves, chances, taken = [], 0, 0
    while game.winner() is None:
        resp = await client.chat.completions.create(model=MODEL, max_tokens=8, temperature=temperature,
                                                    messages=asked(game))
        answer = resp.choices[0].message.content or ""
        move = parse_move(answer)
        # a chance: a line X completes now, else one O would complete next (a block)
        must = game.urgent()
        chances += bool(must)
        taken += move in must
        if move is None or move not in game.free():
            # an illegal or unreadable move is part of the game: it ends it, and is penalized
            return {"winner": None, "invalid": answer[:40], "moves": moves, "chances": chances, "taken": taken}
        game.play(move, "X")
        moves.append(move)
        if game.winner() is None:
            game.play(opponent_move(game, rng), "O")
    return {"winner": game.winner(), "invalid": None, "moves": moves, "chances": chances, "taken": taken}


@art.reward
def result(traj: art.Trajectory) -> float:
    """win 1, draw 0.5, loss 0, an invalid move -0.5."""
    o = traj.outcome
    if o.get("invalid") is not None:
        return -0.5
    return {"x": 1.0, "draw": 0.5, "o": 0.0}[o["winner"]]


@art.reward(weight=0.1)
def legal_moves(traj: art.Trajectory) -> float:
    """A little credit for each legal move, so early training has something to climb."""
    return len(traj.outcome.get("moves", [])) / 5


@art.reward(weight=0.25)
def tactics(traj: art.Trajectory) -> float:
    """Credit per move, not only per game: the share of chances taken -- a move that completes
    a line when one can be completed, else one that blocks O's -- 1 where none arose."""
    o = traj.outcome
    return o.get("taken", 0) / o["chances"] if o.get("chances") else 1.0


__all__ = ["CELLS", "asked", "play", "result", "legal_moves", "tactics", "parse_move"]
