"""2048 on a 4x4 board: slide, merge equal tiles, a new 2 (or 4) appears after each move."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

DIRECTIONS = ("up", "down", "left", "right")


def _slide_row_left(row: list[int]) -> tuple[list[int], int]:
    """One row slid left: (new row, points scored by merges)."""
    tiles = [v for v in row if v]
    out, score, i = [], 0, 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(tiles[i] * 2)
            score += tiles[i] * 2
            i += 2
        else:
            out.append(tiles[i])
            i += 1
    return out + [0] * (len(row) - len(out)), score


@dataclass
class Board:
    """A seeded 2048 game. ``cells`` is row-major, 0 for empty."""

    seed: int = 0
    size: int = 4
    cells: list[int] = field(default_factory=list)
    score: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if not self.cells:
            self.cells = [0] * (self.size * self.size)
            self._spawn()
            self._spawn()

    def rows(self) -> list[list[int]]:
        n = self.size
        return [self.cells[r * n:(r + 1) * n] for r in range(n)]

    def render(self) -> str:
        return "\n".join(" ".join(f"{v or '.':>4}" for v in row) for row in self.rows())

    def _spawn(self) -> None:
        empty = [i for i, v in enumerate(self.cells) if v == 0]
        if empty:
            self.cells[self.rng.choice(empty)] = 4 if self.rng.random() < 0.1 else 2

    def _moved(self, direction: str) -> tuple[list[int], int]:
        n = self.size
        grid = self.rows()
        if direction in ("up", "down"):
            grid = [list(col) for col in zip(*grid)]
        if direction in ("right", "down"):
            grid = [row[::-1] for row in grid]
        slid, score = [], 0
        for row in grid:
            new, pts = _slide_row_left(row)
            slid.append(new)
            score += pts
        if direction in ("right", "down"):
            slid = [row[::-1] for row in slid]
        if direction in ("up", "down"):
            slid = [list(col) for col in zip(*slid)]
        return [v for row in slid for v in row][: n * n], score

    def can_move(self, direction: str) -> bool:
        return self._moved(direction)[0] != self.cells

    def legal(self) -> list[str]:
        return [d for d in DIRECTIONS if self.can_move(d)]

    def merges(self, direction: str) -> int:
        """How many merges sliding this way makes (tiles it joins)."""
        return sum(1 for v in self.cells if v) - sum(1 for v in self._moved(direction)[0] if v)

    def can_merge(self) -> bool:
        """Whether some move merges tiles."""
        return any(self.merges(d) for d in self.legal())

    def options(self) -> str:
        """The moves spelled out for a reader that cannot see the board's lines: those that
        merge tiles, and those that only slide them (a move that changes nothing is left out)."""
        legal = self.legal()
        merging = [d for d in legal if self.merges(d)]
        sliding = [d for d in legal if d not in merging]
        return ((f"Moves that merge tiles: {', '.join(merging)}.\n" if merging else "")
                + (f"Moves that only slide tiles: {', '.join(sliding)}.\n" if sliding else ""))

    def move(self, direction: str) -> None:
        """Play a move; ValueError for an unknown direction or one that changes nothing."""
        if direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}")
        cells, pts = self._moved(direction)
        if cells == self.cells:
            raise ValueError(f"{direction} does not move any tile")
        self.cells, self.score = cells, self.score + pts
        self._spawn()

    @property
    def max_tile(self) -> int:
        return max(self.cells)

    @property
    def over(self) -> bool:
        return not self.legal()


def tile_reward(max_tile: int) -> float:
    """log2 of the largest tile, scaled so 2048 is 1.0 (a 2 is 1/11)."""
    return math.log2(max(max_tile, 2)) / 11


def board_value(cells: list[int]) -> float:
    """The board's total, log-scaled to about [0, 1]."""
    return math.log2(max(sum(cells), 2)) / 16


def scenarios(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1 << 30) for _ in range(n)]
