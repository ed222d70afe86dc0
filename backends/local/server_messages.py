"""The local backend's ``POST /v1/messages``: Anthropic's Messages API on top of the same
engine and chat template as ``/v1/chat/completions``, so an agent written against the
``anthropic`` client trains unchanged.

Content blocks become chat messages (``artsdk.trajectory.message_blocks``: ``tool_use`` blocks the
assistant's tool calls, ``tool_result`` blocks tool messages), the answer is parsed for tool
calls the same way as chat's, and comes back as content blocks with Anthropic's stop reasons
(``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``). Like every answer of this
server, the Message carries the sampled ``token_ids``, their ``logprobs`` and the
``prompt_token_ids`` (top-level fields next to Anthropic's; streamed, the prompt's on
``message_start`` and the answer's on ``message_delta``) and names the adapter step that
answered in ``model`` (``name@step``), so the trajectory trains token-exactly.

Supported: ``messages`` (text, ``tool_use`` and ``tool_result`` blocks; ``thinking`` blocks are
accepted and left out of the prompt), ``system`` (text or text blocks), custom ``tools``
(``tool_choice`` ``{"type": "none"}`` hides them), ``max_tokens`` (required, as Anthropic's),
``temperature`` (0 to 1), ``top_p``, ``stop_sequences``, ``stream`` (Anthropic's event
sequence). Beyond Anthropic's fields: ``seed``. Errors come in Anthropic's shape
(``{"type": "error", "error": {...}}``, ``backends/http.py``). ``POST /v1/messages/count_tokens``
counts a request's prompt as this model's chat template renders it.
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

from artsdk.trajectory.message_blocks import chat_messages, chat_tools, content_blocks

from ..endpoint_record import EndpointRecord, rollout_of, served_call
from .engine import Completion
from .engine import Request as GenRequest
from .generate import MAX_TOKENS_LIMIT, BadRequest, answer, cancel_when_left, prepare, resolve, submit, submit_streaming
from .served import ServedModel


class MessageParam(BaseModel):
    """One message of the conversation: a user's or the assistant's, its content text or
    blocks (each an object with a ``type``)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]

    @field_validator("content")
    @classmethod
    def _blocks(cls, v: Any) -> Any:
        if isinstance(v, list) and any(not isinstance(b.get("type"), str) for b in v):
            raise ValueError("every content block needs a 'type' (text, image, tool_use, tool_result...)")
        return v


class CountTokensRequest(BaseModel):
    """What ``/v1/messages/count_tokens`` reads of a Messages request."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1)
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None


class MessagesRequest(BaseModel):
    """A Messages API request. Sampling fields are checked here, as for chat requests."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # other Anthropic fields are accepted and ignored

    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_LIMIT)
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    temperature: float = Field(1.0, ge=0, le=1)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Optional[int] = None
    stop_sequences: Optional[list[str]] = Field(None, max_length=4)
    stream: bool = False
    seed: Optional[int] = Field(None, ge=-2**63, le=2**63 - 1)  # not Anthropic's: for reproducible samples

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v and any(len(x) > 1000 for x in v):
            raise ValueError("stop sequences are at most 1000 characters each")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: Optional[int]) -> Optional[int]:
        if v is not None:
            raise ValueError("top_k is not supported by this server (it samples with temperature and top_p); "
                             "leave it out")
        return v


def _conversation(served: ServedModel, body: Union[MessagesRequest, CountTokensRequest]) -> tuple[
        list[dict[str, Any]], Optional[list[dict[str, Any]]]]:
    """(the chat view of the request's system and messages, its tools in chat form)."""
    tools = _custom_tools(body.tools) if (body.tool_choice or {}).get("type") != "none" else None
    if len(body.messages) > served.context_length:  # before converting them all
        raise BadRequest(f"messages has {len(body.messages)} entries, more than the model's context of "
                         f"{served.context_length} tokens could hold; shorten it", "messages")
    try:
        return chat_messages([m.model_dump() for m in body.messages], body.system), tools
    except (AttributeError, TypeError, ValueError):
        raise BadRequest("system must be text or a list of text blocks", "system") from None


def add_messages_routes(app: FastAPI, models: Callable[[], dict[str, ServedModel]], record: EndpointRecord) -> None:
    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> dict[str, int]:
        served, _ = resolve(models(), body.model)
        conversation, tools = _conversation(served, body)
        req = await prepare(served, conversation, tools, "messages", max_tokens=1)
        return {"input_tokens": len(req.prompt)}

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Any:
        t0 = time.perf_counter()
        served, step = resolve(models(), body.model)
        conversation, tools = _conversation(served, body)
        stops = list(body.stop_sequences or [])
        req = await prepare(served, conversation, tools, "messages", max_tokens=body.max_tokens,
                            temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=stops)
        mid = f"msg_{uuid.uuid4().hex}"

        def finished(c: Completion) -> dict[str, Any]:
            content, tool_calls = served.chat.parse(c.text, tools)
            blocks = content_blocks(content, tool_calls, mid.removeprefix("msg_"))
            if blocks is None:  # a call whose arguments are no object: what the model wrote, as text
                content, tool_calls = c.text, None
                blocks = [{"type": "text", "text": c.text}] if c.text else []
            rollout, number, via = rollout_of(request.headers)  # the endpoint's own record, by rollout
            record.add(rollout, served_call(
                model=f"{served.spec.name}@{req.step}", messages=conversation, tools=tools,
                params=body.model_dump(exclude_unset=True, exclude={"messages", "model", "tools", "stream", "system"}),
                prompt=req.prompt, outs=[c], texts=[(content, tool_calls)], stream=body.stream,
                latency=time.perf_counter() - t0, call=number, via=via, provider="endpoint-messages"))
            served.continuations.remember(conversation, tools, req.prompt, c.token_ids, {
                "role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})})
            return _message(served, req, mid, c, blocks, stops)

        if body.stream:
            future, events = submit_streaming(served, req, step)
            return StreamingResponse(_events(served, req, mid, future, events, finished, buffered=bool(tools)),
                                     media_type="text/event-stream")
        (c,) = await answer(request, submit(served, req, step), req)
        return finished(c)


def _custom_tools(tools: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
    if not tools:
        return None
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom") or not isinstance(t.get("name"), str) or not t["name"]:
            raise BadRequest(f"tools[{i}]: only custom tools ({{'name': ..., 'description': ..., 'input_schema': "
                             f"...}}) are served here, got type {t.get('type')!r}", f"tools.{i}")
        if not isinstance(t.get("input_schema", {}), dict):
            raise BadRequest(f"tools[{i}].input_schema must be a JSON schema object", f"tools.{i}.input_schema")
    return chat_tools(tools)


def _stop_reason(served: ServedModel, c: Completion, blocks: list[dict[str, Any]],
                 stops: list[str]) -> tuple[str, Optional[str]]:
    """Anthropic's stop reason, and the stop sequence met (the engine cuts it from the text)."""
    if any(b["type"] == "tool_use" for b in blocks):
        return "tool_use", None
    if c.finish_reason == "length":
        return "max_tokens", None
    if stops and c.token_ids:
        rest = served.tokenizer.decode(c.token_ids, skip_special_tokens=True)[len(c.text):]
        met = next((s for s in stops if s and rest.startswith(s)), None)
        if met is not None:
            return "stop_sequence", met
    return "end_turn", None


def _message(served: ServedModel, req: GenRequest, mid: str, c: Completion, blocks: list[dict[str, Any]],
             stops: list[str]) -> dict[str, Any]:
    stop_reason, stop_sequence = _stop_reason(served, c, blocks, stops)
    return {
        "id": mid, "type": "message", "role": "assistant", "model": f"{served.spec.name}@{req.step}",
        "content": blocks, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": len(req.prompt), "output_tokens": len(c.token_ids),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        "token_ids": c.token_ids, "logprobs": c.logprobs, "prompt_token_ids": req.prompt,
    }


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


@cancel_when_left
async def _events(served: ServedModel, req: GenRequest, mid: str, future: Any, queue: "asyncio.Queue[Any]",
                  finished: Callable[[Completion], dict[str, Any]], buffered: bool) -> Any:
    """Anthropic's event sequence: text deltas as tokens are sampled (without tools), or the
    whole answer's blocks at the end (with tools, whose calls are known only then); the
    answer's token ids ride on ``message_delta``."""
    name = f"{served.spec.name}@{req.step}"
    yield _event("message_start", message={
        "id": mid, "type": "message", "role": "assistant", "model": name, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": len(req.prompt), "output_tokens": 0},
        "prompt_token_ids": req.prompt})
    if not buffered:
        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    yield _event("ping")
    while (ev := await queue.get()) is not None:
        _, _token, _logprob, text = ev
        if not buffered and text:
            yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
    try:
        (c,) = future.result()
    except Exception as e:  # noqa: BLE001 - the stream is open: report in-band, in Anthropic's shape
        yield _event("error", error={"type": "api_error", "message": f"generation failed: {e}"})
        return
    message = finished(c)
    if not buffered:
        yield _event("content_block_stop", index=0)
    else:
        for k, block in enumerate(message["content"]):
            if block["type"] == "text":
                yield _event("content_block_start", index=k, content_block={"type": "text", "text": ""})
                yield _event("content_block_delta", index=k, delta={"type": "text_delta", "text": block["text"]})
            else:
                yield _event("content_block_start", index=k, content_block={**block, "input": {}})
                yield _event("content_block_delta", index=k, delta={"type": "input_json_delta",
                                                                    "partial_json": json.dumps(block["input"])})
            yield _event("content_block_stop", index=k)
    yield _event("message_delta", delta={"stop_reason": message["stop_reason"],
                                         "stop_sequence": message["stop_sequence"]},
                 usage={"output_tokens": len(c.token_ids)}, token_ids=c.token_ids, logprobs=c.logprobs)
    yield _event("message_stop")
