"""The HTTP library the installed openai client is built on: ``httpx2`` for openai 3.x,
``httpx`` for 2.x (both supported), for the capture code that builds or wraps its responses."""

from __future__ import annotations

import importlib
from types import ModuleType


def http() -> ModuleType:
    """``httpx2`` or ``httpx``, whichever ``openai`` imports (openai must be installed)."""
    import openai._base_client as base

    return base.httpx2 if hasattr(base, "httpx2") else importlib.import_module("httpx")
