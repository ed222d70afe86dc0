"""Simple players to judge the trained model against, on the same games and rewards: one that
plays a random free cell, one that always plays the first free cell (A1, A2, ... in reading
order), and a scripted one that wins when it can, blocks when it must, and otherwise takes the
centre, a corner, or any cell."""

from __future__ import annotations

import random
from typing import Callable

from .game import CELLS, Game, opponent_move, winner_of

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def random_cell(game: Game, rng: random.Random) -> str:
    return rng.choice(game.free())


def first_free(game: Game, rng: random.Random) -> str:
    return game.free()[0]


def win_block_centre(game: Game, rng: random.Random) -> str:
    board, free = list(game.board), game.free()
    for mark in ("X", "O"):  # win, else block
        for cell in free:
            i = CELLS.index(cell)
            trial = board[:i] + [mark] + board[i + 1:]
            if winner_of(tuple(trial)) == mark:
                return cell
    for cell in ("B2", "A1", "A3", "C1", "C3"):
        if cell in free:
            return cell
    return rng.choice(free)


def play_with(policy: Callable[[Game, random.Random], str], game: Game, draw: int = 0) -> dict:
    """The outcome the rollout would return, had ``policy`` chosen X's moves (a random policy's
    choices seeded by the game and ``draw``; the opponent's by the game alone)."""
    game = Game(seed=game.seed, opponent=game.opponent)
    rng, mine = random.Random(game.seed), random.Random(f"{game.seed}/{draw}")
    moves = []
    while game.winner() is None:
        move = policy(game, mine)
        game.play(move, "X")
        moves.append(move)
        if game.winner() is None:
            game.play(opponent_move(game, rng), "O")
    return {"winner": game.winner(), "invalid": None, "moves": moves}


BASELINES = {"random legal move": random_cell, "first free cell (scripted)": first_free,
             "win, block, centre (scripted)": win_block_centre}
RANDOM = frozenset({"random legal move"})  # baselines whose expected value is taken over many draws
