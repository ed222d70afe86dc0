"""The OpenAI-compatible HTTP server of the local backend (FastAPI + uvicorn).

Every choice carries ``token_ids`` and per-token ``logprobs``; the response names the model
as ``name@step`` and carries ``prompt_token_ids``, so captured trajectories train on exactly
the tokens that were sampled.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from typing import Any, Callable, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from pydantic import BaseModel, ConfigDict, Field, field_validator

from artsdk.errors import TrajectoryError

from ..http import GuardedH11, error, guard
from .engine import Completion, EngineRefused
from .engine import Request as GenRequest
from .served import ServedModel

MAX_BODY = 16 * 1024 * 1024
DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_LIMIT = 1_000_000
_STEP = re.compile(r"[0-9]{1,9}")


class ChatMessage(BaseModel):
    """One chat message, as OpenAI's API takes it (other fields are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None


class ChatRequest(BaseModel):
    """A chat-completion request. Every sampling field is checked here, so one request's bad
    value is its own 400 and never reaches a batch shared with others."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # unknown OpenAI parameters are ignored

    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=-2**63, le=2**63 - 1)
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    logprobs: Optional[bool] = None
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)  # as in vLLM: no stop token before this many

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(len(x) > 1000 for x in stops):
            raise ValueError("at most 4 stop strings of at most 1000 characters each")
        return v


class BadRequest(Exception):
    def __init__(self, message: str, param: Optional[str] = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def build_app(models: Callable[[], dict[str, ServedModel]], api_key: Optional[str] = None) -> FastAPI:
    app = FastAPI(title="artsdk local backend", version="1")

    guard(app, api_key, MAX_BODY)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"] if x != "body")
        return error(400, f"{where}: {first['msg']}", param=where)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return error(exc.status, str(exc), exc.param)

    @app.exception_handler(EngineRefused)
    async def refused(_: Request, exc: EngineRefused) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

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

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> Any:
        served, step = resolve(models(), body.model)
        asked = next((x for x in (body.max_completion_tokens, body.max_tokens) if x is not None), DEFAULT_MAX_TOKENS)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        req = prepare(served, [m.model_dump(exclude_unset=True) for m in body.messages], body.tools, "messages",
                      max_tokens=asked, n=body.n, temperature=body.temperature, top_p=body.top_p, stop=stops,
                      seed=body.seed, min_tokens=max(0, body.min_tokens))
        if body.stream:
            future, events = submit_streaming(served, req, step)
            return StreamingResponse(_stream(served, req, body, future, events), media_type="text/event-stream")
        outs = await asyncio.wrap_future(submit(served, req, step))
        name = f"{served.spec.name}@{req.step}"
        choices = [_choice(served, i, c, body.tools) for i, c in enumerate(outs)]
        completion_tokens = sum(len(c.token_ids) for c in outs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "choices": choices, "prompt_token_ids": req.prompt,
            "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(req.prompt) + completion_tokens},
        }

    from .server_responses import add_responses_routes

    add_responses_routes(app, models)
    return app


def prepare(served: ServedModel, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]], where: str,
            *, max_tokens: int, **sampling: Any) -> GenRequest:
    """A generation request for a conversation: its prompt through the chat template, the
    answer's budget cut to what the context leaves. BadRequest (naming ``where``) when the
    messages do not render or do not fit."""
    try:
        prompt = served.chat.prompt_ids(messages, tools)
    except TrajectoryError as e:
        raise BadRequest(str(e), where) from None
    room = served.context_length - len(prompt)
    if room <= 0:
        raise BadRequest(f"the prompt is {len(prompt)} tokens, longer than the model's context of "
                         f"{served.context_length}; shorten the conversation", where)
    return GenRequest(prompt=prompt, max_tokens=min(max_tokens, room), **sampling)


def resolve(models: dict[str, ServedModel], requested: str) -> tuple[ServedModel, Optional[int]]:
    """The model a request names and the step it asks for (None: the newest when submitted)."""
    name, at, step_text = requested.partition("@")
    served = models.get(name)
    if served is None:
        known = ", ".join(sorted(models)) or "none registered"
        raise BadRequest(f"unknown model {requested[:100]!r}; this server has: {known}", "model")
    if not at:
        return served, None
    if not _STEP.fullmatch(step_text) or int(step_text) not in served.serving:
        raise BadRequest(f"{requested[:100]!r}: step {step_text[:20]} is not being served "
                         f"(serving {sorted(served.serving)}); ask for {name!r} for the newest", "model")
    return served, int(step_text)


def submit_streaming(served: ServedModel, req: GenRequest, step: Optional[int]) -> tuple[Any, "asyncio.Queue[Any]"]:
    """``submit`` for a streamed answer: (the future, a queue that receives each sampled
    token as (choice index, token id, logprob, new text), then None when generation ends)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()
    req.on_token = lambda *ev: loop.call_soon_threadsafe(events.put_nowait, ev)
    future = submit(served, req, step)
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, None))
    return future, events


def submit(served: ServedModel, req: GenRequest, step: Optional[int]) -> Any:
    """Hand the request to the engine, pinned to its step until it is answered."""
    try:
        return served.submit(req, step)
    except ValueError as e:  # the step asked for was retired since it was checked
        raise BadRequest(f"{served.spec.name}@{step}: {e}; ask for {served.spec.name!r} for the newest",
                         "model") from None


def _logprob_content(served: ServedModel, ids: list[int], lps: list[float]) -> list[dict[str, Any]]:
    return [{"token": served.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, lps)]


def _choice(served: ServedModel, index: int, c: Completion, tools: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    content, tool_calls = served.chat.parse(c.text, tools)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index, "message": message,
        "finish_reason": "tool_calls" if tool_calls else (c.finish_reason or "stop"),
        "logprobs": {"content": _logprob_content(served, c.token_ids, c.logprobs)},
        "token_ids": c.token_ids,
    }


async def _stream(served: ServedModel, req: GenRequest, body: ChatRequest, future: Any,
                  events: "asyncio.Queue[Any]") -> Any:
    name = f"{served.spec.name}@{req.step}"
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    buffered = bool(body.tools)  # tool calls are parsed from the whole answer, sent at the end

    def chunk(i: int, delta: dict[str, Any], finish: Optional[str] = None, ids: Optional[list[int]] = None,
              lps: Optional[list[float]] = None, extra: Optional[dict[str, Any]] = None) -> str:
        choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
        if ids:
            choice["token_ids"] = ids
            choice["logprobs"] = {"content": _logprob_content(served, ids, lps or [])}
        data = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": [choice], **(extra or {})}
        return f"data: {json.dumps(data)}\n\n"

    for i in range(req.n):
        yield chunk(i, {"role": "assistant", "content": ""}, extra={"prompt_token_ids": req.prompt} if i == 0 else None)
    while True:
        ev = await events.get()
        if ev is None:
            break
        i, tok, lp, text = ev
        delta = {} if buffered or not text else {"content": text}
        yield chunk(i, delta, ids=[tok], lps=[lp])
    try:
        outs = future.result()
    except Exception as e:  # noqa: BLE001 - the stream is already open: report in-band
        yield f"data: {json.dumps({'error': {'message': f'generation failed: {e}', 'type': 'server_error'}})}\n\n"
        return
    for i, c in enumerate(outs):
        finish = c.finish_reason or "stop"
        if buffered:
            content, tool_calls = served.chat.parse(c.text, body.tools)
            delta: dict[str, Any] = {}
            if content:
                delta["content"] = content
            if tool_calls:
                delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(tool_calls)]
                finish = "tool_calls"
            if delta:
                yield chunk(i, delta)
        yield chunk(i, {}, finish)
    if (body.stream_options or {}).get("include_usage"):
        done = sum(len(c.token_ids) for c in outs)
        usage = {"prompt_tokens": len(req.prompt), "completion_tokens": done,
                 "total_tokens": len(req.prompt) + done}
        yield f"data: {json.dumps({'id': cid, 'object': 'chat.completion.chunk', 'created': created, 'model': name, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


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
                                                     http=GuardedH11))
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
