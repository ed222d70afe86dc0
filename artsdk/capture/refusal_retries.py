"""A strict refusal (``sentinel.py``) reaches the agent as ``CaptureError`` through the openai
and anthropic clients' retry loops. Their older versions (openai 2.x) take any exception from
the transport for a broken connection: they retry it twice, with back-off, then raise
``APIConnectionError`` -- a refusal would look like a network fault, seconds later.

``_sleep_for_retry`` (each client's wait before a retry, called while the failure is being
handled) lets a refusal through at once instead of waiting, and ``request`` unwraps one the
client wrapped on its last try.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

from ..errors import CaptureError


def patch(module: Any) -> None:
    """Wrap the retry loop of ``module``'s base clients (``openai`` or ``anthropic``; idempotent)."""
    try:
        base = importlib.import_module(f"{module.__name__}._base_client")
    except ImportError:  # a client laid out otherwise: a refusal reaches the agent as the client reports it
        return
    for cls, is_async in ((base.SyncAPIClient, False), (base.AsyncAPIClient, True)):
        for name, make in (("request", _async_request if is_async else _sync_request),
                           ("_sleep_for_retry", _async_sleep if is_async else _sync_sleep)):
            orig = cls.__dict__.get(name)
            if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                continue
            wrapper = functools.wraps(orig)(make(orig))
            wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapper)


def unpatch(module: Any) -> None:
    base = sys.modules.get(f"{module.__name__}._base_client")
    for cls in ((base.SyncAPIClient, base.AsyncAPIClient) if base is not None else ()):
        for name in ("request", "_sleep_for_retry"):
            fn = cls.__dict__.get(name)
            if getattr(fn, "__artsdk_wrapped__", False):
                setattr(cls, name, fn.__wrapped__)


def _refused() -> None:
    """Raise the refusal being handled now, if one is."""
    exc = sys.exc_info()[1]
    if isinstance(exc, CaptureError):
        raise exc


def _unwrap(exc: BaseException) -> None:
    """Raise the refusal the client wrapped in ``exc`` (as its cause), if it did."""
    if isinstance(exc.__cause__, CaptureError):
        raise exc.__cause__ from None


def _sync_sleep(orig: Callable[..., Any]) -> Callable[..., Any]:
    def sleep(*args: Any, **kwargs: Any) -> Any:
        _refused()
        return orig(*args, **kwargs)

    return sleep


def _async_sleep(orig: Callable[..., Any]) -> Callable[..., Any]:
    async def sleep(*args: Any, **kwargs: Any) -> Any:
        _refused()
        return await orig(*args, **kwargs)

    return sleep


def _sync_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    def request(*args: Any, **kwargs: Any) -> Any:
        try:
            return orig(*args, **kwargs)
        except Exception as exc:
            _unwrap(exc)
            raise

    return request


def _async_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    async def request(*args: Any, **kwargs: Any) -> Any:
        try:
            return await orig(*args, **kwargs)
        except Exception as exc:
            _unwrap(exc)
            raise

    return request
