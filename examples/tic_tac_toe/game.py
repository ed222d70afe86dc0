"""Tic-tac-toe: the board, the rules, what a position threatens, and three opponents (random,
blocker, minimax)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

ROWS, COLS = "ABC", "123"
CELLS = [r + c for r in ROWS for c in COLS]
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


@dataclass
class Game:
    """A game the agent plays as X. ``seed`` fixes the opponent's choices; ``opponent`` is
    "random" (any free cell), "blocker" (wins when it can, blocks X's win when it must, else any
    free cell) or "minimax" (never loses)."""

    seed: int = 0
    opponent: str = "random"
    board: list[str] = field(default_factory=lambda: ["."] * 9)

    def render(self) -> str:
        lines = ["   " + " ".join(COLS)]
        for r, name in enumerate(ROWS):
            lines.append(f"{name}  " + " ".join(self.board[r * 3:r * 3 + 3]))
        return "\n".join(lines)

    def free(self) -> list[str]:
        return [CELLS[i] for i, v in enumerate(self.board) if v == "."]

    def play(self, cell: str, mark: str) -> None:
        i = CELLS.index(cell)
        if self.board[i] != ".":
            raise ValueError(f"{cell} is taken")
        self.board[i] = mark

    def winner(self) -> Optional[str]:
        """"x", "o", "draw", or None while the game goes on."""
        return winner_of(tuple(self.board))

    def urgent(self) -> list[str]:
        """The cells a move must take now: where X completes a line, else where O would next
        (a block); none when neither."""
        return winning_cells(self.board, "X") or winning_cells(self.board, "O")

    def threats(self) -> str:
        """What the position threatens, spelled out for a reader that cannot see lines (one
        line each, none when nothing is threatened): the cells where X completes a line now,
        and those where O would complete one next."""
        wins, losses = winning_cells(self.board, "X"), winning_cells(self.board, "O")
        return ((f"You can win at {' '.join(wins)}.\n" if wins else "")
                + (f"O threatens to win at {' '.join(losses)}.\n" if losses else ""))


def winner_of(board: tuple[str, ...]) -> Optional[str]:
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a].lower()
    return "draw" if "." not in board else None


def winning_cells(board: list[str], mark: str) -> list[str]:
    """The free cells where ``mark`` ("X" or "O") would complete a line."""
    cells = []
    for i, v in enumerate(board):
        if v == "." and winner_of(tuple(board[:i] + [mark] + board[i + 1:])) == mark.lower():
            cells.append(CELLS[i])
    return cells


@lru_cache(maxsize=None)
def _score(board: tuple[str, ...], to_move: str) -> int:
    w = winner_of(board)
    if w is not None:
        return {"o": 1, "x": -1, "draw": 0}[w]
    scores = []
    for i, v in enumerate(board):
        if v == ".":
            nxt = board[:i] + (to_move,) + board[i + 1:]
            scores.append(_score(nxt, "X" if to_move == "O" else "O"))
    return max(scores) if to_move == "O" else min(scores)


def opponent_move(game: Game, rng: random.Random) -> str:
    free = game.free()
    if game.opponent == "minimax":
        board = tuple(game.board)
        best = max(_score(board[:CELLS.index(c)] + ("O",) + board[CELLS.index(c) + 1:], "X") for c in free)
        free = [c for c in free
                if _score(board[:CELLS.index(c)] + ("O",) + board[CELLS.index(c) + 1:], "X") == best]
    elif game.opponent == "blocker":
        free = winning_cells(game.board, "O") or winning_cells(game.board, "X") or free
    return rng.choice(free)


def scenarios(n: int, seed: int = 0, opponent: str = "random") -> list[Game]:
    """``n`` seeded games."""
    rng = random.Random(seed)
    return [Game(seed=rng.randrange(1 << 30), opponent=opponent) for _ in range(n)]
