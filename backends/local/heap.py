"""The process's heap, where glibc's malloc holds it: how many arenas it may spread over, which
allocations get pages of their own, and giving freed memory back.

glibc gives each thread that allocates an arena of its own (up to eight per core). The local
backend allocates from several threads -- the engine's, the server's, the worker threads a
training step runs in -- and memory one thread freed sits in its arena where another cannot
reuse it: on the demo's path (SmolLM2-135M, two steps) the peak was 2.64 GB with glibc's default
and 1.89 GB with two arenas, the same answers sampled and trained (docs/benchmarks.md#memory).

glibc also maps an allocation of 128 KiB or more to pages of its own, handed back when it is freed
-- until the first such block is freed, when it raises that threshold to the block's size (up to 32
MiB), and from then on a training step's activations (half a MB to a few MB each) come from the
arenas, where rows of other lengths leave holes between them. A fixed threshold of 4 MiB keeps the
largest on pages of their own whatever was freed before: the demo's path peaked at 1.91 to 2.21 GB
with glibc's, and at 1.91 to 1.96 GB with 4 MiB, a step inside glibc's spread in time. Lower
thresholds cost time in page faults: 1 MiB made a training step up to 8% slower, 128 KiB about 30%
(docs/benchmarks.md#memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Optional

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt's parameter numbers (malloc.h)


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


def map_from(kib: int) -> bool:
    """Give each allocation of ``kib`` KiB or more pages of its own from now on, whatever is
    freed later (0: glibc's own threshold, which rises with the blocks freed). False where the C
    library is not glibc."""
    libc = _glibc()
    if libc is None or kib <= 0:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(kib) * 1024))


def give_back() -> None:
    """Return the freed memory at the top of each arena to the system: glibc keeps it, and a
    process that trained once would hold its peak for good."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
