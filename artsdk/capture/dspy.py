"""DSPy: its default engine talks HTTP with a transport of its own, past every patched
client. Inside a rollout or a session its calls are sent through its LiteLLM engine instead
(a choice DSPy itself offers), where the litellm patch records and routes them."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

from . import context

_MODULE = "dspy.clients.execution"


def patch(module: Any) -> None:
    execution = sys.modules.get(_MODULE)
    if execution is None:
        import importlib

        execution = importlib.import_module(_MODULE)
    orig = execution.select_backend
    if getattr(orig, "__artsdk_wrapped__", False):
        return
    execution.select_backend = _wrap(orig)


def unpatch(module: Any) -> None:
    execution = sys.modules.get(_MODULE)
    fn = getattr(execution, "select_backend", None)
    if getattr(fn, "__artsdk_wrapped__", False):
        execution.select_backend = fn.__wrapped__


def _wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
    def select_backend(lm: Any, options: Any = None) -> Any:
        selection = orig(lm, options)
        if selection.native and context.active():
            return dataclasses.replace(selection, native=False)  # the LiteLLM engine: captured
        return selection

    select_backend.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
    select_backend.__wrapped__ = orig  # type: ignore[attr-defined]
    return select_backend
