"""Simple players to judge the trained model against, on the same games and rewards: one that
plays a random free cell, one that always plays the first free cell (A1, A2, ... in reading
order), and a scripted one that wins when it can, blocks when it must, and otherwise takes the
centre, a corner, or any cell."""

from __future__ import annotations

import random
from typing import Callable, Optional

from .game import Game, opponent_move


def random_cell(game: Game, rng: random.Random) -> str:
    return rng.choice(game.free())


def first_free(game: Game, rng: random.Random) -> str:
    return game.free()[0]


def win_block_centre(game: Game, rng: random.Random) -> str:
    free = game.free()
    tactical = game.urgent()  # win, else block
    if tactical:
        return tactical[0]
    for cell in ("B2", "A1", "A3", "C1", "C3"):
        if cell in free:
            return cell
    return rng.choice(free)


def play_with(policy: Callable[[Game, random.Random], str], game: Game, draw: int = 0,
              seen: Optional[Callable[[Game, str], None]] = None) -> dict:
    """The outcome the rollout would return, had ``policy`` chosen X's moves (a random policy's
    choices seeded by the game and ``draw``; the opponent's by the game alone). ``seen`` is
    told each position and the move chosen in it."""
    game = Game(seed=game.seed, opponent=game.opponent)
    rng, mine = random.Random(game.seed), random.Random(f"{game.seed}/{draw}")
    moves, chances, taken = [], 0, 0
    while game.winner() is None:
        move = policy(game, mine)
        if seen is not None:
            seen(game, move)
        must = game.urgent()
        chances, taken = chances + bool(must), taken + (move in must)
        game.play(move, "X")
        moves.append(move)
        if game.winner() is None:
            game.play(opponent_move(game, rng), "O")
    return {"winner": game.winner(), "invalid": None, "moves": moves, "chances": chances, "taken": taken}


BASELINES = {"random legal move": random_cell, "first free cell (scripted)": first_free,
             "win, block, centre (scripted)": win_block_centre}
RANDOM = frozenset({"random legal move"})  # baselines whose expected value is taken over many draws
