"""The escape sentinel (``sentinel.py``) under the standard library's ``http.client``, which
``urllib.request``, urllib3 and ``requests`` all send through: ``HTTPConnection.putrequest``,
the first thing every request on such a connection does (urllib3 overrides ``request`` but
still calls it). What the connection then sends was judged there (``HTTPConnection.send``
says so to the socket's sentinel under it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .sentinel import check, sending_judged


def patch(module: Any) -> None:
    """Wrap ``http.client.HTTPConnection.putrequest`` and ``send`` (idempotent)."""
    cls = module.HTTPConnection
    orig = cls.__dict__.get("putrequest")
    if orig is None or getattr(orig, "__artsdk_wrapped__", False):
        return

    def putrequest(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        path = urlsplit(url).path if "://" in url else url.split("?")[0]
        scheme = "https" if type(self).__name__.startswith("HTTPS") or getattr(self, "scheme", "") == "https" \
            else "http"
        full = url if "://" in url else f"{scheme}://{self.host}:{self.port}{url}"
        check(method, full, path, "urllib / requests (http.client)")
        return orig(self, method, url, *args, **kwargs)

    orig_send = cls.__dict__["send"]

    def send(self: Any, data: Any) -> Any:
        with sending_judged():
            return orig_send(self, data)

    for name, wrapper, wrapped in (("putrequest", putrequest, orig), ("send", send, orig_send)):
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = wrapped  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)


def unpatch(module: Any) -> None:
    for name in ("putrequest", "send"):
        fn = module.HTTPConnection.__dict__.get(name)
        if getattr(fn, "__artsdk_wrapped__", False):
            setattr(module.HTTPConnection, name, fn.__wrapped__)
