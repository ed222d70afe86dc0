"""The rollout follows the agent into threads: work started inside a rollout on a new
``threading.Thread`` or a bare ``_thread.start_new_thread``, or handed to a
``ThreadPoolExecutor`` (which ``loop.run_in_executor`` uses) or a ``multiprocessing``
``ThreadPool`` -- even one made before the rollout -- runs in a copy of the rollout's context,
so the LLM calls it makes are recorded in the rollout's trajectory like any other. A pool's own
threads are not the rollout's, even when it starts them inside one: they serve its later work
too. A long-lived thread that takes work from a queue is not the rollout's: hand it ``art.bind(fn)``
(``artsdk/rollout/reconcile.py``), or its calls to the trainable model reach the endpoint with no
rollout (logged there)."""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

from .cassette import current_cassette
from .context import current_recorder


def _inside() -> bool:
    return current_recorder.get() is not None or current_cassette.get() is not None


def _in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    return functools.partial(contextvars.copy_context().run, fn) if _inside() else fn


def patch(module: Any) -> None:
    """Wrap ``threading.Thread.start``, ``_thread.start_new_thread``, ``ThreadPoolExecutor.submit``
    and ``ThreadPool``'s task methods (idempotent)."""
    import _thread
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.pool import ThreadPool

    new_thread = _thread.start_new_thread
    if not getattr(new_thread, "__artsdk_wrapped__", False):
        def start_new_thread_in_context(function: Callable[..., Any], args: Any, kwargs: Any = None) -> Any:
            return new_thread(_in_context(function), args, kwargs or {})

        _mark(start_new_thread_in_context, new_thread)
        _thread.start_new_thread = start_new_thread_in_context  # type: ignore[assignment]
    for name in ("apply_async", "_map_async", "imap", "imap_unordered"):  # what apply, map, starmap... go through
        method = getattr(ThreadPool, name, None) or getattr(ThreadPool.__mro__[1], name)
        if getattr(method, "__artsdk_wrapped__", False):
            continue

        def task_in_context(self: Any, func: Callable[..., Any], *args: Any, _method: Any = method, **kwargs: Any) -> Any:
            return _method(self, _in_context(func), *args, **kwargs)

        _mark(task_in_context, method)
        setattr(ThreadPool, name, task_in_context)  # on ThreadPool: a process Pool cannot pickle a context
    init = ThreadPool.__init__
    if not getattr(init, "__artsdk_wrapped__", False):
        def init_outside(self: Any, *args: Any, **kwargs: Any) -> None:
            # its threads (made now, and again when one ends) serve every rollout's tasks, each
            # task in its own submitter's context: none of them is a rollout's thread
            contextvars.Context().run(init, self, *args, **kwargs)

        _mark(init_outside, init)
        ThreadPool.__init__ = init_outside  # type: ignore[method-assign]
    start = module.Thread.start
    if not getattr(start, "__artsdk_wrapped__", False):
        def start_in_context(self: Any) -> Any:
            if _inside():
                run, ctx = self.run, contextvars.copy_context()

                def run_in_context() -> None:
                    try:
                        ctx.run(run)
                    finally:  # it refers to the thread: gone once run, the thread is freed when let go of
                        vars(self).pop("run", None)

                self.run = run_in_context  # an instance attribute: subclasses' run() too
            return start(self)

        _mark(start_in_context, start)
        module.Thread.start = start_in_context
    submit = ThreadPoolExecutor.submit
    if not getattr(submit, "__artsdk_wrapped__", False):
        def submit_in_context(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            if not _inside():
                return submit(self, fn, *args, **kwargs)
            # the work runs in the rollout's context; a thread the pool starts for it does not:
            # it serves the pool's later work too, and would keep this rollout's recording alive
            return contextvars.Context().run(submit, self, functools.partial(contextvars.copy_context().run, fn),
                                             *args, **kwargs)

        _mark(submit_in_context, submit)
        ThreadPoolExecutor.submit = submit_in_context  # type: ignore[method-assign]


def unpatch(module: Any) -> None:
    import _thread
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.pool import ThreadPool

    for cls, name in ((module.Thread, "start"), (ThreadPoolExecutor, "submit"), (ThreadPool, "__init__"),
                      *((ThreadPool, n) for n in ("apply_async", "_map_async", "imap", "imap_unordered"))):
        fn = cls.__dict__.get(name)
        if getattr(fn, "__artsdk_wrapped__", False):
            if fn.__wrapped__ is getattr(cls.__mro__[1], name, None):
                delattr(cls, name)
            else:
                setattr(cls, name, fn.__wrapped__)
    if getattr(_thread.start_new_thread, "__artsdk_wrapped__", False):
        _thread.start_new_thread = _thread.start_new_thread.__wrapped__  # type: ignore[attr-defined]


def _mark(wrapper: Callable[..., Any], orig: Callable[..., Any]) -> None:
    wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    functools.update_wrapper(wrapper, orig, assigned=("__name__", "__qualname__", "__doc__"), updated=())
