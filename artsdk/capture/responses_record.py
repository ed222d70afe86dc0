"""Turning a Responses API request and its response (or stream of events) into an
``LLMCall``, and back for replay. One reader serves the openai and litellm patches.

The call keeps the items as sent and received (``params["input"]``, ``params["tools"]``,
``params["instructions"]``, ``previous_response_id``...; the answer's ``output`` items and
``id`` on its message) and the chat view the rest of artsdk reads (``messages``, ``tools``,
the answer as an assistant message with ``tool_calls``). A server that samples the answer
itself (artsdk's backends) adds ``token_ids``, ``logprobs`` and ``prompt_token_ids`` to the
response: they are kept, so the call trains token-exactly.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional

from ..trajectory.response_items import (add_chat_message, as_item, assistant_message, chat_head, chat_tools, items_of,
                                         plain)
from ..trajectory.records import Choice, LLMCall, constructed
from .prefix import folded, reused
from .record import CUT, extra_field, given, response_format_sent, served_step

_NOT_PARAMS = frozenset({"model", "stream", "extra_headers", "extra_query", "timeout", "api_key", "api_base",
                         "base_url", "client", "http_client", "text_format"})


def responses_request(kwargs: dict[str, Any]) -> tuple[str, list[dict[str, Any]], Any, dict[str, Any]]:
    """(model, chat messages, chat tools, params) of a ``responses.create`` call; params keep
    the request's own fields as sent (items included)."""
    instructions = kwargs.get("instructions")
    instructions = instructions if isinstance(instructions, str) else None
    given_items = kwargs.get("input")
    # a list: the copies an earlier call of the rollout made of its leading items are reused (prefix.py)
    items = reused("responses", given_items, as_item) if isinstance(given_items, list) else items_of(given_items)
    params: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in _NOT_PARAMS or not given(v) or v is None:
            continue
        if k == "input":
            v = items
        elif k == "tools":
            v = [as_item(t) for t in v]
        elif isinstance(v, type):
            v = response_format_sent(v)
        else:  # a copy: the agent may change its include list or text options for the next call
            v = plain(v)
        params[k] = v
    tf = kwargs.get("text_format")
    if tf is not None and given(tf):  # .parse(text_format=Model): the format the client sends, its schema
        params["text"] = {**(params.get("text") or {}), "format": _text_format_sent(tf)}
    messages = folded("responses chat", chat_head(instructions), items, add_chat_message)
    return str(kwargs.get("model", "")), messages, chat_tools(kwargs.get("tools")), params


def _text_format_sent(cls: type) -> Any:
    try:
        from openai.lib._parsing._responses import type_to_text_format_param

        return type_to_text_format_param(cls)
    except Exception:  # noqa: BLE001 - as chat's response_format
        sent = response_format_sent(cls)
        return {"type": "json_schema", **sent["json_schema"]} if isinstance(sent, dict) else sent


def _choice(resp: Any) -> Choice:
    output = [as_item(i) for i in (getattr(resp, "output", None) or ())]
    message = assistant_message(output)
    message["output"] = output
    message["id"] = getattr(resp, "id", None)
    status = getattr(resp, "status", None)
    details = getattr(resp, "incomplete_details", None)
    if message.get("tool_calls"):
        finish = "tool_calls"
    elif status == "incomplete" and getattr(details, "reason", None) == "max_output_tokens":
        finish = "length"
    else:
        finish = "stop" if status in (None, "completed") else status
    token_ids, logprobs = extra_field(resp, "token_ids"), extra_field(resp, "logprobs")
    return Choice(index=0, message=message, finish_reason=finish,
                  token_ids=list(token_ids) if token_ids else None, logprobs=list(logprobs) if logprobs else None)


def _usage(resp: Any) -> Optional[dict[str, Any]]:
    u = getattr(resp, "usage", None)
    if u is None:
        return None
    get = (lambda k: u.get(k)) if isinstance(u, dict) else (lambda k: getattr(u, k, None))
    return {"prompt_tokens": get("input_tokens"), "completion_tokens": get("output_tokens"),
            "total_tokens": get("total_tokens")}


def from_response(provider: str, kwargs: dict[str, Any], resp: Any, latency: float, *, stream: bool = False,
                  request: Optional[tuple[str, list[dict[str, Any]], Any, dict[str, Any]]] = None) -> LLMCall:
    """An LLMCall from a complete Response (or ParsedResponse)."""
    model, messages, tools, params = request or responses_request(kwargs)
    served_by = getattr(resp, "model", None)
    # built without validating the messages again, as chat's calls are (record.from_response):
    # validating would copy every message of the conversation on every call
    return constructed(LLMCall, provider=provider, model=model, messages=messages, tools=tools, params=params,
                       choices=[_choice(resp)], served_by=served_by, step=served_step(served_by),
                       usage=_usage(resp), latency=latency, stream=stream,
                       prompt_token_ids=extra_field(resp, "prompt_token_ids"))


class ResponsesStreamAccumulator:
    """Assembles a stream of Responses events: the final response when the stream got as far
    as ``response.completed`` (or ``incomplete`` / ``failed``), else what the deltas said."""

    def __init__(self, provider: str, kwargs: dict[str, Any], request: Optional[tuple[Any, ...]] = None) -> None:
        self.provider = provider
        self.request = request or responses_request(kwargs)  # (the request as sent, read before it went out)
        self.final: Any = None
        self.latest: Any = None  # the response as of the newest event that carried one
        self.text: list[str] = []
        self.items: dict[int, dict[str, Any]] = {}

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        resp = getattr(event, "response", None)
        if resp is not None:
            self.latest = resp
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                self.final = resp
        elif kind == "response.output_text.delta":
            self.text.append(getattr(event, "delta", "") or "")
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self.items[getattr(event, "output_index", len(self.items))] = as_item(event.item)
        elif kind == "response.function_call_arguments.delta":
            item = self.items.get(getattr(event, "output_index", -1))
            if item is not None and item.get("status") != "completed":
                item["arguments"] = (item.get("arguments") or "") + (getattr(event, "delta", "") or "")

    @property
    def finished(self) -> bool:
        return self.final is not None

    def to_call(self, latency: float, left_early: bool, failure: Optional[str] = None) -> LLMCall:
        if self.final is not None:
            return from_response(self.provider, {}, self.final, latency, stream=True, request=self.request)
        model, messages, tools, params = self.request
        output = [self.items[k] for k in sorted(self.items)]
        message = assistant_message(output)
        if not message.get("content") and self.text:
            message["content"] = "".join(self.text)
        message["output"] = output
        served_by = getattr(self.latest, "model", None)
        return constructed(LLMCall, provider=self.provider, model=model, messages=messages, tools=tools,
                           params=params, choices=[Choice(index=0, message=message, finish_reason=None)],
                           served_by=served_by, step=served_step(served_by), latency=latency, stream=True,
                           incomplete=True, error=failure or (None if left_early else CUT))


def response_from_call(call: LLMCall) -> dict[str, Any]:
    """A recorded Responses call as a Response dict (for replay)."""
    message = call.message or {}
    output = message.get("output") or []
    return {"id": message.get("id") or "resp_replay", "object": "response", "created_at": time.time(),
            "model": call.served_by or call.model, "status": "completed", "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": call.params.get("tools") or [],
            "usage": None}


def events_from_call(call: LLMCall) -> Iterable[dict[str, Any]]:
    """Events that replay a recorded Responses call as a stream: created, each output item
    (its text as one delta), completed."""
    resp = response_from_call(call)
    seq = iter(range(10**9))
    yield {"type": "response.created", "sequence_number": next(seq),
           "response": {**resp, "status": "in_progress", "output": []}}
    for k, item in enumerate(resp["output"]):
        parts = item.get("content") or []
        yield {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": k,
               "item": {**item, "content": []} if item.get("type") == "message" else item}
        for c, part in enumerate(parts):
            where = {"output_index": k, "item_id": item.get("id", ""), "content_index": c}
            yield {"type": "response.content_part.added", "sequence_number": next(seq), **where,
                   "part": {**part, "text": ""} if part.get("type") == "output_text" else part}
            if part.get("type") == "output_text":
                yield {"type": "response.output_text.delta", "sequence_number": next(seq), **where,
                       "delta": part.get("text", ""), "logprobs": []}
            yield {"type": "response.content_part.done", "sequence_number": next(seq), **where, "part": part}
        yield {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": k, "item": item}
    yield {"type": "response.completed", "sequence_number": next(seq), "response": resp}
