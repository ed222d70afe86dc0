"""litellm's logging callbacks run as the agent's own code, not as part of the call they
report on. litellm runs them after a call, from a thread (sync) or from its logging worker's
task (async), in a context copied while the patched call was still running: without this, an
LLM call a callback makes (a judge, a guardrail, a logger that summarises) would pass through
as the patched call's own inner request -- unrecorded, unrouted, unreported.

Each handler of ``litellm_logging.Logging`` is wrapped to run in the rollout of the call that
made it (fixed when litellm makes the handler's coroutine, not when its worker runs it) with no
patched call running, so a call inside it is recorded as a call of its own.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

from .context import current_recorder, inside_call

_SYNC = ("success_handler", "failure_handler")
_ASYNC = ("async_success_handler", "async_failure_handler")


def patch() -> None:
    """Wrap the handlers of litellm's ``Logging`` class (idempotent)."""
    try:
        cls = importlib.import_module("litellm.litellm_core_utils.litellm_logging").Logging
    except (ImportError, AttributeError):  # a litellm laid out otherwise: its callbacks stay inside the call
        return
    for name in _SYNC + _ASYNC:
        orig = cls.__dict__.get(name)
        if orig is None or getattr(orig, "__artsdk_wrapped__", False):
            continue
        wrapper = _async(orig) if name in _ASYNC else _sync(orig)
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)


def unpatch() -> None:
    cls = getattr(importlib.import_module("litellm.litellm_core_utils.litellm_logging"), "Logging", None)
    for name in _SYNC + _ASYNC:
        fn = cls.__dict__.get(name) if cls is not None else None
        if getattr(fn, "__artsdk_wrapped__", False):
            setattr(cls, name, fn.__wrapped__)


def _sync(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def handler(*args: Any, **kwargs: Any) -> Any:
        token = inside_call.set(False)
        try:
            return orig(*args, **kwargs)
        finally:
            inside_call.reset(token)

    return handler


def _async(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def handler(*args: Any, **kwargs: Any) -> Any:
        rollout = current_recorder.get()  # whose call this reports on: the worker's own context is another's

        async def run() -> Any:
            tokens = current_recorder.set(rollout), inside_call.set(False)
            try:
                return await orig(*args, **kwargs)
            finally:
                inside_call.reset(tokens[1])
                current_recorder.reset(tokens[0])

        return run()

    return handler
