"""What every backend server does to a request before its route sees it: the API key, the
body-size limit (counted on the bytes that arrive, chunked or not), and time limits on a
request's headers and body, so a client that trickles bytes cannot hold a connection; and the
thread a server runs in."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
from typing import Any, Optional

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from artsdk.slow_clients import HEADER_TIMEOUT, KEEP_ALIVE, GuardedH11

__all__ = ["BODY_TIMEOUT", "HEADER_TIMEOUT", "KEEP_ALIVE", "Guard", "GuardedH11", "ServerThread", "api_docs",
           "error", "guard", "session_key"]

BODY_TIMEOUT = 60.0  # seconds to receive a whole request body


# Anthropic's error types by status, for the routes of its Messages API
_ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error(status: int, message: str, param: Optional[str] = None,
          kind: str = "invalid_request_error", path: str = "") -> JSONResponse:
    """An error body in the shape of the API ``path`` belongs to: Anthropic's
    (``{"type": "error", "error": {"type", "message"}}``) for ``/v1/messages`` (and its
    ``count_tokens``), OpenAI's otherwise."""
    if path.rstrip("/").endswith(("/v1/messages", "/v1/messages/count_tokens")):
        return JSONResponse({"type": "error", "error": {"type": _ANTHROPIC_KINDS.get(status, "api_error"),
                                                        "message": message}}, status_code=status)
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def session_key(configured: Optional[str] = None) -> str:
    """The key a session's server checks: the one configured (``api_key``), else a fresh random
    one (192 bits) made for this server's life. The patched clients, ``art.rollout_env()`` and
    the session's ``endpoint.api_key`` carry it; nothing else on the machine knows it."""
    return configured or secrets.token_urlsafe(24)


def api_docs(on: bool) -> dict[str, Any]:
    """FastAPI's arguments for the interactive docs and the OpenAPI schema: off on a session's
    servers unless asked for (``docs = true`` in ``backend_options``)."""
    return {} if on else {"docs_url": None, "redoc_url": None, "openapi_url": None}


def guard(app: FastAPI, api_key: Optional[str], max_body: int, body_timeout: Optional[float] = None) -> None:
    """With a key, every route but /health needs ``Authorization: Bearer <key>`` (or
    ``x-api-key: <key>``, as Anthropic's clients send it; 401
    otherwise, and nothing happens); a body over ``max_body`` bytes gets 413 -- at once when
    its Content-Length says so, else as soon as that many bytes have arrived -- and a body
    that takes longer than ``body_timeout`` seconds to arrive gets 408."""
    app.add_middleware(Guard, api_key=api_key, max_body=max_body,
                       timeout=body_timeout if body_timeout is not None else BODY_TIMEOUT)


class Guard:
    """Pure ASGI middleware (no task of its own between the server and the route): the key
    and the declared length are checked before anything is read; ``receive`` is wrapped to
    count the body bytes that actually arrive and to give up on a body that comes too
    slowly, raising an HTTP error that the route's body parsing passes on."""

    def __init__(self, app: Any, api_key: Optional[str], max_body: int, timeout: float) -> None:
        self.app, self.api_key, self.max_body, self.timeout = app, api_key, max_body, timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if self.api_key is not None and scope["path"] != "/health":
            bearer = secrets.compare_digest(headers.get(b"authorization", b""), f"Bearer {self.api_key}".encode())
            if not bearer and not secrets.compare_digest(headers.get(b"x-api-key", b""), self.api_key.encode()):
                await error(401, "missing or wrong API key (Authorization: Bearer <key>, or x-api-key: <key>)",
                            kind="authentication_error", path=scope["path"])(scope, receive, send)
                return
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            await error(413, f"request body of {int(length)} bytes is over the limit of {self.max_body}",
                        path=scope["path"])(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        received, complete = 0, False

        async def counted() -> Any:
            nonlocal received, complete
            if complete:  # the body is in: later reads wait for a disconnect, for as long as a response streams
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.timeout:.0f} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise HTTPException(413, f"request body over the limit of {self.max_body} bytes")
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, counted, send)


class ServerThread:
    """uvicorn in a background thread, bound to ``host`` (127.0.0.1 unless told otherwise)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                     http=GuardedH11, timeout_keep_alive=KEEP_ALIVE))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="artsdk-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the inference server did not start on {host}:{self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        self._sock.close()
