"""The process's heap, where glibc's malloc holds it: how many arenas it may spread over, and
giving freed memory back.

glibc gives each thread that allocates an arena of its own (up to eight per core). The local
backend allocates from several threads -- the engine's, the server's, the worker threads a
training step runs in -- and memory one thread freed sits in its arena where another cannot
reuse it: on the demo's path (SmolLM2-135M, two steps) the peak was 2.64 GB with glibc's default
and 1.89 GB with two arenas, the same answers sampled and trained (docs/benchmarks.md#memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Optional

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


@functools.lru_cache(maxsize=1)
def _glibc() -> Optional[Any]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it: musl's or macOS's malloc is left alone
        return libc
    except (OSError, AttributeError):
        return None


def limit_arenas(arenas: int) -> bool:
    """Let malloc use at most ``arenas`` arenas from now on (0: glibc's own limit, unchanged).
    Threads that already have one keep it. False where the C library is not glibc."""
    libc = _glibc()
    if libc is None or arenas <= 0:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, int(arenas)))


def give_back() -> None:
    """Return the freed memory at the top of each arena to the system: glibc keeps it, and a
    process that trained once would hold its peak for good."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
