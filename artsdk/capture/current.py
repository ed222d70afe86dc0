"""The running rollout's recorder, as a context variable, and the process it runs in: defined
here, below the modules that read them (``record.py``, ``context.py``), so none of them imports
another to reach them."""

from __future__ import annotations

import os
from contextvars import ContextVar
from typing import Any, Optional

current_recorder: ContextVar[Optional[Any]] = ContextVar("artsdk_recorder", default=None)
"""The ``Recorder`` (context.py) of the rollout running in this context, or None."""

pid = os.getpid()
"""This process's id, read on every captured call (a forked child inherits its parent's context,
not its rollouts): kept here, and renewed in a forked child, instead of asking the kernel each time."""


def _forked() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
