"""The 2048 agent: each turn it is shown the board and answers with a direction."""

from __future__ import annotations

import re

from openai import AsyncOpenAI

import artsdk as art

from .game import DIRECTIONS, Board, board_value, tile_reward

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "agent-2048"
MAX_TURNS = 12
SYSTEM = ("You play 2048. Tiles slide all the way in the direction you choose and equal tiles merge. "
          "Answer with one word: up, down, left or right.")
ASK = "Which direction do you slide? Answer with one word."
_WORD = re.compile(r"\b(up|down|left|right)\b", re.I)


def parse_direction(text: str) -> str | None:
    m = _WORD.search(text or "")
    return m.group(1).lower() if m else None


def asked(board: Board) -> list[dict]:
    """What the agent is asked each turn: the board, and which moves merge or only slide."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Board:\n{board.render()}\n{board.options()}{ASK}"}]


@art.rollout(name="2048")
async def play(seed: int, turns: int = MAX_TURNS, temperature: float = 1.0) -> dict:
    board = Board(seed=seed)
    moves: list[str] = []
    chances = merged = 0
    for _ in range(turns):
        if board.over:
            break
        resp = await client.chat.completions.create(model=MODEL, max_tokens=6, temperature=temperature,
                                                    messages=asked(board))
        answer = resp.choices[0].message.content or ""
        direction = parse_direction(answer)
        chances += board.can_merge()  # a turn where some move merges tiles
        if direction is None or not board.can_move(direction):
            # part of the game: an unreadable or useless move ends it, and is penalized
            return {"max_tile": board.max_tile, "cells": board.cells, "moves": moves, "invalid": answer[:40],
                    "chances": chances, "merged": merged}
        merged += board.merges(direction) > 0
        board.move(direction)
        moves.append(direction)
    return {"max_tile": board.max_tile, "cells": board.cells, "moves": moves, "invalid": None,
            "chances": chances, "merged": merged}


@art.reward
def largest_tile(traj: art.Trajectory) -> float:
    return tile_reward(traj.outcome["max_tile"])


@art.reward(weight=0.5)
def board(traj: art.Trajectory) -> float:
    return board_value(traj.outcome["cells"])


@art.reward
def invalid_move(traj: art.Trajectory) -> float:
    return -0.5 if traj.outcome.get("invalid") is not None else 0.0


@art.reward(weight=0.1)
def merging(traj: art.Trajectory) -> float:
    """Credit per move, not only per game: the share of turns that merged tiles, of those where
    some move could (1 where none could)."""
    o = traj.outcome
    return o.get("merged", 0) / o["chances"] if o.get("chances") else 1.0


REWARDS = [largest_tile, board, invalid_move, merging]
__all__ = ["DIRECTIONS", "asked", "play", "REWARDS", "parse_direction"]
