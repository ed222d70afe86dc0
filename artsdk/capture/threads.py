"""The rollout follows the agent into threads: work started inside a rollout on a new
``threading.Thread`` or handed to a ``ThreadPoolExecutor`` (which ``loop.run_in_executor``
uses) runs in a copy of the rollout's context, so the LLM calls it makes are recorded in the
rollout's trajectory like any other (a thread started elsewhere, earlier, is not the
rollout's; what it sends to a model is not attributed to one)."""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

from .cassette import current_cassette
from .context import current_recorder


def _inside() -> bool:
    return current_recorder.get() is not None or current_cassette.get() is not None


def patch(module: Any) -> None:
    """Wrap ``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` (idempotent)."""
    from concurrent.futures import ThreadPoolExecutor

    start = module.Thread.start
    if not getattr(start, "__artsdk_wrapped__", False):
        def start_in_context(self: Any) -> Any:
            if _inside():
                run, ctx = self.run, contextvars.copy_context()
                self.run = lambda: ctx.run(run)  # an instance attribute: subclasses' run() too
            return start(self)

        _mark(start_in_context, start)
        module.Thread.start = start_in_context
    submit = ThreadPoolExecutor.submit
    if not getattr(submit, "__artsdk_wrapped__", False):
        def submit_in_context(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            if _inside():
                fn = functools.partial(contextvars.copy_context().run, fn)
            return submit(self, fn, *args, **kwargs)

        _mark(submit_in_context, submit)
        ThreadPoolExecutor.submit = submit_in_context  # type: ignore[method-assign]


def unpatch(module: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    for cls, name in ((module.Thread, "start"), (ThreadPoolExecutor, "submit")):
        fn = cls.__dict__.get(name)
        if getattr(fn, "__artsdk_wrapped__", False):
            setattr(cls, name, fn.__wrapped__)


def _mark(wrapper: Callable[..., Any], orig: Callable[..., Any]) -> None:
    wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    functools.update_wrapper(wrapper, orig, assigned=("__name__", "__qualname__", "__doc__"), updated=())
