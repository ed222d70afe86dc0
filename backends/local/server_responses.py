"""The local backend's ``POST /v1/responses``: the OpenAI Responses API on top of the same
engine and chat template as ``/v1/chat/completions``.

Input items become chat messages (``artsdk.trajectory.response_items``), the answer is parsed for tool
calls the same way, and comes back as output items. Like every answer of this server, the
response carries the sampled ``token_ids``, their ``logprobs`` and the ``prompt_token_ids``
(top-level fields next to OpenAI's), and names the adapter step that answered in ``model``
(``name@step``), so a Responses-API agent trains token-exactly.

Supported: ``input`` (text or items: messages, ``function_call``, ``function_call_output``;
reasoning items are accepted and left out of the prompt), ``instructions``, function
``tools`` (``tool_choice="none"`` hides them), ``max_output_tokens``, ``temperature``,
``top_p``, ``stream`` (the Responses events), and ``previous_response_id`` for the responses
this server kept (``store``, on by default: the newest 1024 are kept in memory). Beyond
OpenAI's fields, as in chat completions: ``seed`` and ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from artsdk.trajectory.response_items import chat_messages, chat_tools, items_of, output_items

from ..endpoint_record import EndpointRecord, rollout_of, served_call
from .engine import Completion
from .engine import Request as GenRequest
from .served import ServedModel
from .generate import (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT, BadRequest, answer, cancel_when_left, prepare, resolve,
                       submit, submit_streaming)

KEPT = 1024  # stored responses, for previous_response_id


class ResponsesRequest(BaseModel):
    """A Responses API request. Sampling fields are checked here, as for chat requests."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # other OpenAI fields are accepted and ignored

    model: str = Field(min_length=1, max_length=256)
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_output_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    store: bool = True
    previous_response_id: Optional[str] = Field(None, max_length=256)
    seed: Optional[int] = Field(None, ge=-2**63, le=2**63 - 1)  # not OpenAI's: for reproducible samples
    stop: Optional[list[str]] = Field(None, max_length=4)  # not OpenAI's: as in chat completions

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v and any(len(x) > 1000 for x in v):
            raise ValueError("stop strings are at most 1000 characters each")
        return v


class History:
    """The newest responses (their whole conversation, as chat messages, and the model that
    answered), by id."""

    def __init__(self, size: int = KEPT) -> None:
        self.size = size
        self.kept: "OrderedDict[str, tuple[str, list[dict[str, Any]]]]" = OrderedDict()

    def get(self, response_id: str, model: str) -> list[dict[str, Any]]:
        """The conversation ``response_id`` ended, for a request to ``model`` (its name: any of
        its steps may continue it); BadRequest when it was not kept, or another model's."""
        if response_id not in self.kept:
            raise BadRequest(f"previous_response_id {response_id[:80]!r} is not a response this server kept (it "
                             f"keeps the newest {self.size} stored ones, in memory); send the whole conversation "
                             f"as input instead", "previous_response_id")
        owner, conversation = self.kept[response_id]
        if owner != model:
            raise BadRequest(f"previous_response_id {response_id[:80]!r} was answered by model {owner!r}, not "
                             f"{model[:100]!r}: a response continues the model's own conversation",
                             "previous_response_id")
        return list(conversation)

    def put(self, response_id: str, model: str, conversation: list[dict[str, Any]]) -> None:
        self.kept[response_id] = (model, conversation)
        while len(self.kept) > self.size:
            self.kept.popitem(last=False)


def add_responses_routes(app: FastAPI, models: Callable[[], dict[str, ServedModel]], record: EndpointRecord) -> None:
    history = History()

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Any:
        t0 = time.perf_counter()
        served, step = resolve(models(), body.model)
        tools = _function_tools(body.tools) if body.tool_choice != "none" else None
        if isinstance(body.input, list) and len(body.input) > served.context_length:  # before converting them all
            raise BadRequest(f"input has {len(body.input)} items, more than the model's context of "
                             f"{served.context_length} tokens could hold; shorten it", "input")
        try:
            turn = chat_messages(items_of(body.input))
        except (AttributeError, TypeError):
            raise BadRequest("input must be text or a list of Responses items", "input") from None
        name = served.spec.name
        earlier = history.get(body.previous_response_id, name) if body.previous_response_id else []
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        conversation = earlier + turn
        req = await prepare(served, system + conversation, tools, "input",
                            max_tokens=body.max_output_tokens or DEFAULT_MAX_TOKENS, temperature=body.temperature,
                            top_p=body.top_p, seed=body.seed, stop=list(body.stop or []))
        rid = f"resp_{uuid.uuid4().hex}"

        def finished(c: Completion) -> dict[str, Any]:
            content, tool_calls = served.chat.parse(c.text, tools)
            rollout, number, via = rollout_of(request.headers)  # the endpoint's own record, by rollout
            record.add(rollout, served_call(
                model=f"{name}@{req.step}", messages=system + conversation, tools=tools, params=body.model_dump(
                    exclude_unset=True, exclude={"input", "model", "tools", "stream", "instructions"}),
                prompt=req.prompt, outs=[c], texts=[(content, tool_calls)], stream=body.stream,
                latency=time.perf_counter() - t0, call=number, via=via, provider="endpoint-responses"))
            served.continuations.remember(system + conversation, tools, req.prompt, c.token_ids, {
                "role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})})
            out = _response(served, body, req, rid, c, content, tool_calls)
            if body.store:
                history.put(rid, name, conversation + [{"role": "assistant", "content": content,
                                                        **({"tool_calls": tool_calls} if tool_calls else {})}])
            return out

        if body.stream:
            future, events = submit_streaming(served, req, step)
            return StreamingResponse(_events(served, req, body, rid, future, events, finished, buffered=bool(tools)),
                                     media_type="text/event-stream")
        (c,) = await answer(request, submit(served, req, step), req)
        return finished(c)


def _function_tools(tools: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
    if not tools:
        return None
    other = [t.get("type") for t in tools if t.get("type") != "function" or not t.get("name")]
    if other:
        raise BadRequest(f"only function tools ({{'type': 'function', 'name': ...}}) are served here, got "
                         f"{other[0]!r}", "tools")
    return chat_tools(tools)


def _response(served: ServedModel, body: ResponsesRequest, req: GenRequest, rid: str, c: Completion,
              content: Optional[str], tool_calls: Optional[list[dict[str, Any]]]) -> dict[str, Any]:
    output = output_items(content, tool_calls, rid.removeprefix("resp_"))
    for item in output:
        if item["type"] == "message":  # logprobs of the whole answer, as OpenAI's include=[...logprobs] gives
            item["content"][0]["logprobs"] = [{"token": served.tokenizer.decode([t]), "logprob": lp, "bytes": [],
                                               "top_logprobs": []} for t, lp in zip(c.token_ids, c.logprobs)]
    cut = c.finish_reason == "length" and not tool_calls
    return {
        "id": rid, "object": "response", "created_at": time.time(), "model": f"{served.spec.name}@{req.step}",
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output, "instructions": body.instructions, "tools": body.tools or [],
        "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": True, "temperature": body.temperature,
        "top_p": body.top_p, "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id, "store": body.store,
        "usage": {"input_tokens": len(req.prompt), "output_tokens": len(c.token_ids),
                  "total_tokens": len(req.prompt) + len(c.token_ids), "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "token_ids": c.token_ids, "logprobs": c.logprobs, "prompt_token_ids": req.prompt,
    }


@cancel_when_left
async def _events(served: ServedModel, req: GenRequest, body: ResponsesRequest, rid: str, future: Any,
                  queue: "asyncio.Queue[Any]", finished: Callable[[Completion], dict[str, Any]],
                  buffered: bool) -> Any:
    """The Responses event stream: text deltas as tokens are sampled (without tools), or the
    whole answer parsed at the end (with tools, whose calls are known only then)."""
    seq = iter(range(10**9))

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

    start = {"id": rid, "object": "response", "created_at": time.time(), "status": "in_progress",
             "model": f"{served.spec.name}@{req.step}", "output": [], "tools": body.tools or [],
             "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": True}
    yield event("response.created", response=start)
    msg_id = f"msg_{rid.removeprefix('resp_')}"
    if not buffered:
        yield event("response.output_item.added", output_index=0,
                    item={"type": "message", "id": msg_id, "role": "assistant", "status": "in_progress", "content": []})
        yield event("response.content_part.added", output_index=0, item_id=msg_id, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})
    while (ev := await queue.get()) is not None:
        _, token, logprob, text = ev
        if not buffered and text:
            yield event("response.output_text.delta", output_index=0, item_id=msg_id, content_index=0, delta=text,
                        logprobs=[{"token": served.tokenizer.decode([token]), "logprob": logprob, "top_logprobs": []}])
    try:
        (c,) = future.result()
    except Exception as e:  # noqa: BLE001 - the stream is open: report in-band
        yield event("error", code="server_error", message=f"generation failed: {e}", param=None)
        return
    response = finished(c)
    for k, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            if buffered:
                yield event("response.output_item.added", output_index=k, item={**item, "content": []})
                yield event("response.content_part.added", output_index=k, item_id=item["id"], content_index=0,
                            part={**part, "text": "", "logprobs": []})
                yield event("response.output_text.delta", output_index=k, item_id=item["id"], content_index=0,
                            delta=part["text"], logprobs=part["logprobs"])
            yield event("response.output_text.done", output_index=k, item_id=item["id"], content_index=0,
                        text=part["text"], logprobs=part["logprobs"])
            yield event("response.content_part.done", output_index=k, item_id=item["id"], content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=k, item={**item, "arguments": ""})
            yield event("response.function_call_arguments.delta", output_index=k, item_id=item["id"],
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", output_index=k, item_id=item["id"],
                        arguments=item["arguments"], name=item["name"])
        yield event("response.output_item.done", output_index=k, item=item)
    if not buffered and not any(i["type"] == "message" for i in response["output"]):
        # the text came out empty: close the message item that was opened for it
        empty = {"type": "message", "id": msg_id, "role": "assistant", "status": "completed", "content": []}
        yield event("response.output_item.done", output_index=0, item=empty)
    # "completed" also for an answer cut at max_output_tokens (its status says "incomplete"): the
    # openai client's stream helper fails without a completed event
    yield event("response.completed", response=response)
