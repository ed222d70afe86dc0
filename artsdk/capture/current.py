"""The running rollout's recorder, as a context variable: defined here, below the modules that
read it (``record.py``, ``context.py``), so none of them imports another to reach it."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Optional

current_recorder: ContextVar[Optional[Any]] = ContextVar("artsdk_recorder", default=None)
"""The ``Recorder`` (context.py) of the rollout running in this context, or None."""
