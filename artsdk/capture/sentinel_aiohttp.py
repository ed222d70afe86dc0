"""The escape sentinel (``sentinel.py``) under ``aiohttp``: ``ClientSession._request``, which
every request method of a session goes through."""

from __future__ import annotations

from typing import Any

from .sentinel import check, sending_judged


def patch(module: Any) -> None:
    """Wrap ``aiohttp.ClientSession._request`` (idempotent)."""
    cls = module.ClientSession
    orig = cls.__dict__.get("_request")
    if orig is None or getattr(orig, "__artsdk_wrapped__", False):
        return

    async def _request(self: Any, method: str, str_or_url: Any, *args: Any, **kwargs: Any) -> Any:
        url = module.client.URL(str_or_url) if not hasattr(str_or_url, "path") else str_or_url
        if self._base_url is not None and not url.is_absolute():
            url = self._base_url.join(url)
        check(method, str(url), url.path, "aiohttp", kwargs.get("headers"))
        with sending_judged():
            return await orig(self, method, str_or_url, *args, **kwargs)

    _request.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
    _request.__wrapped__ = orig  # type: ignore[attr-defined]
    cls._request = _request


def unpatch(module: Any) -> None:
    fn = module.ClientSession.__dict__.get("_request")
    if getattr(fn, "__artsdk_wrapped__", False):
        module.ClientSession._request = fn.__wrapped__
