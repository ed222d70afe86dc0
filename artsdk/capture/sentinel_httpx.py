"""The escape sentinel (``sentinel.py``) under ``httpx`` and ``httpx2``: ``Client.send`` and
``AsyncClient.send``, through which the openai client, litellm and most frameworks send."""

from __future__ import annotations

from typing import Any, Callable

from .sentinel import check


def patch(module: Any) -> None:
    """Wrap ``Client.send`` and ``AsyncClient.send`` of an imported httpx / httpx2 (idempotent)."""
    for cls, is_async in ((module.Client, False), (module.AsyncClient, True)):
        orig = cls.__dict__.get("send")
        if orig is None or getattr(orig, "__artsdk_wrapped__", False):
            continue
        wrapper = _async_send(orig, module.__name__) if is_async else _sync_send(orig, module.__name__)
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        cls.send = wrapper


def unpatch(module: Any) -> None:
    for cls in (module.Client, module.AsyncClient):
        fn = cls.__dict__.get("send")
        if getattr(fn, "__artsdk_wrapped__", False):
            cls.send = fn.__wrapped__


def _check(request: Any, library: str) -> None:
    check(request.method, str(request.url), request.url.path, f"a {library} client", request.headers)


def _sync_send(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _check(request, library)
        return orig(self, request, *args, **kwargs)

    return send


def _async_send(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _check(request, library)
        return await orig(self, request, *args, **kwargs)

    return send
