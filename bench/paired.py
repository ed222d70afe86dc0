"""Paired timing of two ways of making the same call, shared by both sides of
``bench/capture_vs_art.py`` (this module imports nothing of artsdk's or ART's: ART's worker runs
it from ART's venv).

``pairs(plain, captured, n)`` makes ``n`` pairs of one uncaptured and one captured call, one
right after the other (which goes first alternates), and gives each pair's difference, captured
minus uncaptured, in wall time and in the process's CPU time. A pair's two calls are
milliseconds apart, so whatever slows the machine for longer than that hits both alike and
leaves their difference; a block of calls of each kind, timed as a whole, carries the
machine's drift between blocks into every difference.
"""

from __future__ import annotations

import time
from typing import Callable


def pairs(plain: Callable[[], object], captured: Callable[[], object], n: int) -> dict[str, list[float]]:
    """``{"wall": [...], "cpu": [...]}``: per pair, captured - uncaptured seconds; and
    ``"uncaptured"``: each pair's uncaptured call, in wall seconds."""
    wall, cpu, alone = [], [], []
    clock, cpu_clock = time.perf_counter, time.process_time  # (the process's: work a capture hands a thread counts)
    for i in range(n):
        first, second = (plain, captured) if i % 2 == 0 else (captured, plain)
        t0, c0 = clock(), cpu_clock()
        first()
        t1, c1 = clock(), cpu_clock()
        second()
        t2, c2 = clock(), cpu_clock()
        sign = 1 if i % 2 == 0 else -1  # (second - first) is captured - uncaptured when the uncaptured went first
        wall.append(sign * ((t2 - t1) - (t1 - t0)))
        cpu.append(sign * ((c2 - c1) - (c1 - c0)))
        alone.append(t1 - t0 if i % 2 == 0 else t2 - t1)
    return {"wall": wall, "cpu": cpu, "uncaptured": alone}
