"""Simple players to judge the trained model against, on the same boards and rewards: one
that picks a random direction that moves something, a scripted corner strategy (down, then
left, then right, then up, the first that moves), and a scripted one that takes the first move
(up, down, left, right) that merges tiles, else the first that moves."""

from __future__ import annotations

import random
from typing import Callable, Optional

from .game import Board


def random_move(board: Board, rng: random.Random) -> str:
    return rng.choice(board.legal())


def corner(board: Board, rng: random.Random) -> str:
    return next(d for d in ("down", "left", "right", "up") if board.can_move(d))


def merge_first(board: Board, rng: random.Random) -> str:
    legal = board.legal()
    return next((d for d in legal if board.merges(d)), legal[0])


def play_with(policy: Callable[[Board, random.Random], str], seed: int, turns: int, draw: int = 0,
              seen: Optional[Callable[[Board, str], None]] = None) -> dict:
    """The outcome the rollout would return, had ``policy`` chosen the moves (a random policy's
    choices seeded by the board and ``draw``). ``seen`` is told each board and the move chosen."""
    board, rng, moves = Board(seed=seed), random.Random(f"{seed}/{draw}"), []
    chances = merged = 0
    for _ in range(turns):
        if board.over:
            break
        direction = policy(board, rng)
        if seen is not None:
            seen(board, direction)
        chances += board.can_merge()
        merged += board.merges(direction) > 0
        board.move(direction)
        moves.append(direction)
    return {"max_tile": board.max_tile, "cells": board.cells, "moves": moves, "invalid": None,
            "chances": chances, "merged": merged}


BASELINES = {"random legal move": random_move, "down-left-right-up (scripted)": corner,
             "first merging move (scripted)": merge_first}
RANDOM = frozenset({"random legal move"})  # baselines whose expected value is taken over many draws
