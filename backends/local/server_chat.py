"""The local server's ``POST /v1/chat/completions``: OpenAI's chat completions on the
engine, plain and streamed, with tool calls parsed from the answer.

Every choice carries ``token_ids`` and per-token ``logprobs``; the response names the model
as ``name@step`` and carries ``prompt_token_ids``, so captured trajectories train on exactly
the tokens that were sampled.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Callable, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..endpoint_record import EndpointRecord, rollout_of, served_call
from .engine import Completion
from .engine import Request as GenRequest
from .generate import (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT, answer, cancel_when_left, logprob_content, prepare,
                       resolve, submit, submit_streaming)
from .served import ServedModel


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


def add_chat_routes(app: FastAPI, models: Callable[[], dict[str, ServedModel]], record: EndpointRecord) -> None:
    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        t0 = time.perf_counter()
        served, step = resolve(models(), body.model)
        asked = next((x for x in (body.max_completion_tokens, body.max_tokens) if x is not None), DEFAULT_MAX_TOKENS)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        # a long conversation's dump takes a while (100,000 messages: 0.3 s): off the event loop
        messages = await asyncio.to_thread(lambda: [m.model_dump(exclude_unset=True) for m in body.messages])
        req = await prepare(served, messages, body.tools,
                            "messages", max_tokens=asked, n=body.n, temperature=body.temperature, top_p=body.top_p,
                            stop=stops, seed=body.seed, min_tokens=max(0, body.min_tokens))
        def keep(outs: list[Completion]) -> None:
            """The endpoint's own record of the call, by rollout; each answer, for the next turn."""
            rollout, number, via = rollout_of(request.headers)
            texts = [served.chat.parse(c.text, body.tools) for c in outs]
            record.add(rollout, served_call(
                model=f"{served.spec.name}@{req.step}", messages=messages,
                tools=body.tools, params=body.model_dump(exclude_unset=True, exclude={"messages", "model", "tools",
                                                                                      "stream", "stream_options"}),
                prompt=req.prompt, outs=outs, texts=texts,
                stream=body.stream, latency=time.perf_counter() - t0, call=number, via=via))
            for c, (content, tool_calls) in zip(outs, texts):
                answer = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
                served.continuations.remember(messages, body.tools, req.prompt, c.token_ids, answer)

        if body.stream:
            future, events = submit_streaming(served, req, step)
            return StreamingResponse(_stream(served, req, body, future, events, keep), media_type="text/event-stream")
        outs = await answer(request, submit(served, req, step), req)
        keep(outs)
        name = f"{served.spec.name}@{req.step}"
        choices = [_choice(served, i, c, body.tools) for i, c in enumerate(outs)]
        completion_tokens = sum(len(c.token_ids) for c in outs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "choices": choices, "prompt_token_ids": req.prompt,
            "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(req.prompt) + completion_tokens},
        }


def _choice(served: ServedModel, index: int, c: Completion, tools: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    content, tool_calls = served.chat.parse(c.text, tools)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index, "message": message,
        "finish_reason": "tool_calls" if tool_calls else (c.finish_reason or "stop"),
        "logprobs": {"content": logprob_content(served, c.token_ids, c.logprobs)},
        "token_ids": c.token_ids,
    }


@cancel_when_left
async def _stream(served: ServedModel, req: GenRequest, body: ChatRequest, future: Any,
                  events: "asyncio.Queue[Any]", keep: Callable[[list[Completion]], None]) -> Any:
    name = f"{served.spec.name}@{req.step}"
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    buffered = bool(body.tools)  # tool calls are parsed from the whole answer, sent at the end

    def chunk(i: int, delta: dict[str, Any], finish: Optional[str] = None, ids: Optional[list[int]] = None,
              lps: Optional[list[float]] = None, extra: Optional[dict[str, Any]] = None) -> str:
        choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
        if ids:
            choice["token_ids"] = ids
            choice["logprobs"] = {"content": logprob_content(served, ids, lps or [])}
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
    keep(outs)  # before the answer ends: a client that has read it all finds it recorded
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


