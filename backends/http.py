"""What every backend server does to a request before its route sees it."""

from __future__ import annotations

import secrets
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def error(status: int, message: str, param: Optional[str] = None,
          kind: str = "invalid_request_error") -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def guard(app: FastAPI, api_key: Optional[str], max_body: int) -> None:
    """With a key, every route but /health needs ``Authorization: Bearer <key>`` (401
    otherwise, and nothing happens); a body declared over ``max_body`` bytes gets 413."""

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Any:
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong API key (Authorization: Bearer <key>)",
                             kind="authentication_error")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body:
            return error(413, f"request body of {length} bytes is over the limit of {max_body}")
        return await call_next(request)
