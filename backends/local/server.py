"""The OpenAI-compatible HTTP server of the local backend (FastAPI + uvicorn): the app, with
what every route shares (the key, body limits, errors, ``/health``, ``/v1/models``) and the
API surfaces it serves -- chat completions (``server_chat.py``), the Responses API
(``server_responses.py``) and Anthropic's Messages API (``server_messages.py``; its errors in
Anthropic's shape). ``backends.http.ServerThread`` runs it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..endpoint_record import EndpointRecord, PerRolloutPaths
from ..http import api_docs, error, guard
from .engine import EngineRefused
from .generate import MAX_BODY, BadRequest, ClientGone
from .served import ServedModel
from .server_chat import add_chat_routes
from .server_messages import add_messages_routes
from .server_responses import add_responses_routes


def build_app(models: Callable[[], dict[str, ServedModel]], api_key: Optional[str] = None,
              record: Optional[EndpointRecord] = None, docs: bool = False) -> FastAPI:
    """The app serving every model ``models()`` holds; each answered call is kept in
    ``record`` by the rollout that made it (endpoint_record.py). With ``api_key`` every route
    but /health needs it; ``docs`` serves /docs and /openapi.json."""
    app = FastAPI(title="artsdk local backend", version="1", **api_docs(docs))
    record = record if record is not None else EndpointRecord()

    app.add_middleware(PerRolloutPaths, record=record)
    guard(app, api_key, MAX_BODY)  # added last, so it runs first: no key, nothing else happens

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"] if x != "body")
        return error(400, f"{where}: {first['msg']}", param=where, path=request.url.path)

    @app.exception_handler(BadRequest)
    async def bad(request: Request, exc: BadRequest) -> JSONResponse:
        return error(exc.status, str(exc), exc.param, path=request.url.path)

    @app.exception_handler(ClientGone)
    async def gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody is there to read it

    @app.exception_handler(EngineRefused)
    async def refused(request: Request, exc: EngineRefused) -> JSONResponse:
        return error(400, str(exc), path=request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), path=request.url.path)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = []
        for name, m in models().items():
            data.append({"id": name, "object": "model", "owned_by": "artsdk", "root": m.spec.base_model,
                         "step": m.step})
            for step in sorted(m.serving):
                data.append({"id": f"{name}@{step}", "object": "model", "owned_by": "artsdk",
                             "root": m.spec.base_model, "step": step})
        return {"object": "list", "data": data}

    add_chat_routes(app, models, record)
    add_responses_routes(app, models, record)
    add_messages_routes(app, models, record)
    return app
