"""The escape sentinel (``sentinel.py``) at the bottom: the socket. Any HTTP/1.1 client written
in Python writes its request line to a ``socket.socket`` (or, over TLS, to an ``ssl`` socket or
an ``SSLObject``), so a request the sentinels of the libraries above did not see -- a raw
socket, httpcore or an httpx transport used directly, tornado, niquests and requests over
urllib3-future -- is seen here, by its request line and headers.

A request a sentinel above already judged (it sets ``sentinel.judged`` while it sends) is not
judged again here, so a call is reported once, by the library that made it. A websocket's
opening GET is looked at too: a Realtime API session is reported, since no websocket's messages
are recorded. What no Python socket carries in HTTP/1.1 is beyond it: HTTP/2's binary frames
from a client below httpx, and clients that send from native code (pycurl, BAML); those reach a
trainable model through ``art.rollout_url()``.
"""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit

from .current import current_recorder
from .sentinel import check, judged, sending_judged

_LIBRARY = "a plain socket (a raw socket, or an HTTP client artsdk has no sentinel in, such as httpcore, " \
           "tornado or niquests)"
_HEAD = 16384  # a request's line and headers, as much of them as is looked at


def patch(module: Any) -> None:
    """Wrap the sending methods of ``socket.socket``, or of ``ssl.SSLSocket`` and
    ``ssl.SSLObject`` (idempotent)."""
    if module.__name__ == "socket":
        targets = [(module.socket, name, False) for name in ("send", "sendall", "sendmsg")]
    else:
        targets = [(module.SSLSocket, "send", True), (module.SSLSocket, "sendall", True),
                   (module.SSLObject, "write", True)]
    for cls, name, tls in targets:
        orig = getattr(cls, name, None)
        if orig is None or getattr(orig, "__artsdk_wrapped__", False):
            continue
        wrapper = _sendmsg(orig) if name == "sendmsg" else _send(orig, tls)
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)


def unpatch(module: Any) -> None:
    classes = [module.socket] if module.__name__ == "socket" else [module.SSLSocket, module.SSLObject]
    for cls in classes:
        for name in ("send", "sendall", "sendmsg", "write"):
            fn = cls.__dict__.get(name)
            if getattr(fn, "__artsdk_wrapped__", False):
                if getattr(cls.__bases__[0], name, None) is fn.__wrapped__:
                    delattr(cls, name)  # it was inherited: put the inheritance back
                else:
                    setattr(cls, name, fn.__wrapped__)


def _send(orig: Any, tls: bool) -> Any:
    def send(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is None or judged.get():
            return orig(self, data, *args, **kwargs)
        _judge(self, data, tls)
        with sending_judged():  # SSLSocket.sendall sends through send: one look is enough
            return orig(self, data, *args, **kwargs)

    return send


def _sendmsg(orig: Any) -> Any:
    def sendmsg(self: Any, buffers: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is not None and not judged.get():
            buffers = list(buffers)
            if buffers:
                _judge(self, buffers[0], False)
        return orig(self, buffers, *args, **kwargs)

    return sendmsg


def _judge(sock: Any, data: Any, tls: bool) -> None:
    """``check`` a POST whose request line starts ``data``, or a GET opening a websocket (the
    Realtime API's); anything else passes."""
    try:
        view = memoryview(data)
    except TypeError:
        return
    method = "POST" if view[:5] == b"POST " else "GET" if view[:4] == b"GET " else None
    if method is None:
        return
    request = _parse(bytes(view[:_HEAD]))
    if request is None:
        return
    target, headers = request
    if method == "GET" and headers.get("upgrade", "").lower() != "websocket":
        return
    where = headers.get("host") or _peer(sock)
    scheme = ("wss" if tls else "ws") if method == "GET" else ("https" if tls else "http")
    url = target if "://" in target else f"{scheme}://{where}{target}"  # a proxy's: whole
    check(method, url, urlsplit(url).path, _LIBRARY, headers)


def _parse(head: bytes) -> Optional[tuple[str, dict[str, str]]]:
    """(the request target, the headers by lower-case name) of an HTTP/1.x request's head."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    headers = {}
    for field in rest.split(b"\r\n"):
        if not field:
            break
        name, colon, value = field.partition(b":")
        if colon:
            headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
    return parts[1].decode("latin-1"), headers


def _peer(sock: Any) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, AttributeError, ValueError):  # an SSLObject has no socket of its own
        return "unknown-host"
    return f"{host}:{port}"
