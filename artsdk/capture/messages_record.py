"""Turning an Anthropic Messages API request and its answer (a Message, or its stream of
events) into an ``LLMCall``, and back for replay.

The call keeps the request's own fields as sent (``params["messages"]`` with their blocks,
``params["system"]``, ``params["tools"]``, ``max_tokens``, ``thinking``...) and the answer's
content blocks (``message["blocks"]``, with ``id`` and ``stop_reason``), and the chat view the
rest of artsdk reads (``messages``, ``tools``, the answer as an assistant message with
``tool_calls``; ``artsdk/trajectory/message_blocks.py``). A server that samples the answer itself
(artsdk's backends) adds ``token_ids``, ``logprobs`` and ``prompt_token_ids`` to the Message:
they are kept, so the call trains token-exactly.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from ..trajectory.message_blocks import (add_chat_messages, as_block, assistant_message, blocks_of, chat_tools,
                                        system_text)
from ..trajectory.records import Choice, LLMCall, constructed
from ..trajectory.response_items import chat_head, plain
from .prefix import folded, reused
from .record import CUT, extra_field, given, served_step

_NOT_PARAMS = frozenset({"model", "stream", "extra_headers", "extra_query", "timeout", "output_format"})
_SAMPLING = ("temperature", "top_p", "top_k")
# the Messages API's stop reasons, as chat's finish reasons
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "pause_turn": "stop", "refusal": "content_filter"}


def messages_request(kwargs: dict[str, Any]) -> tuple[str, list[dict[str, Any]], Any, dict[str, Any]]:
    """(model, chat messages, chat tools, params) of a ``messages.create`` call; params keep
    the request's own fields as sent (blocks included)."""
    params: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in _NOT_PARAMS or not given(v) or v is None:
            continue
        if k == "messages":
            v = reused("messages", v, _message)  # the copies an earlier call made reused (prefix.py)
        elif k in ("tools", "system") and not isinstance(v, str):
            v = [as_block(x) for x in v]
        else:  # a copy: the agent may change its stop sequences or metadata for the next call
            v = plain(v)
        params[k] = v
    extra = params.get("extra_body")
    for k in _SAMPLING:  # anthropic 2.x takes sampling fields in extra_body: the training reads them here
        if isinstance(extra, dict) and k in extra and k not in params:
            params[k] = extra[k]
    head = chat_head(system_text(kwargs.get("system")))
    messages = folded("messages chat", head, params.get("messages") or [], add_chat_messages)
    return str(kwargs.get("model", "")), messages, chat_tools(kwargs.get("tools")), params


def _message(m: Any) -> dict[str, Any]:
    """A message of the request as a plain dict, its content as blocks."""
    message = as_block(m)
    return {**message, "content": blocks_of(message.get("content"))}


def _choice(blocks: list[dict[str, Any]], message_id: Any, stop_reason: Any, token_ids: Any = None,
            logprobs: Any = None) -> Choice:
    message = assistant_message(blocks)
    message.update(blocks=blocks, id=message_id, stop_reason=stop_reason)
    return Choice(index=0, message=message, finish_reason=FINISH.get(stop_reason, stop_reason),
                  token_ids=list(token_ids) if token_ids else None, logprobs=list(logprobs) if logprobs else None)


def _usage(u: Any) -> Optional[dict[str, Any]]:
    if u is None:
        return None
    get = (lambda k: u.get(k)) if isinstance(u, dict) else (lambda k: getattr(u, k, None))
    prompt, done = get("input_tokens"), get("output_tokens")
    total = prompt + done if isinstance(prompt, int) and isinstance(done, int) else None
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": total}


def from_response(provider: str, kwargs: dict[str, Any], resp: Any, latency: float, *, stream: bool = False,
                  request: Optional[tuple[str, list[dict[str, Any]], Any, dict[str, Any]]] = None) -> LLMCall:
    """An LLMCall from a complete Message."""
    model, messages, tools, params = request or messages_request(kwargs)
    served_by = getattr(resp, "model", None)
    blocks = [as_block(b) for b in (getattr(resp, "content", None) or ())]
    choice = _choice(blocks, getattr(resp, "id", None), getattr(resp, "stop_reason", None),
                     extra_field(resp, "token_ids"), extra_field(resp, "logprobs"))
    # built without validating the messages again, as chat's calls are (record.from_response)
    return constructed(LLMCall, provider=provider, model=model, messages=messages, tools=tools, params=params,
                       choices=[choice], served_by=served_by, step=served_step(served_by),
                       usage=_usage(getattr(resp, "usage", None)), latency=latency, stream=stream,
                       prompt_token_ids=extra_field(resp, "prompt_token_ids"))


class MessagesStreamAccumulator:
    """Assembles a stream of Messages events (``message_start``, ``content_block_start`` /
    ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``) into the Message they make."""

    def __init__(self, provider: str, kwargs: dict[str, Any], request: Optional[tuple[Any, ...]] = None) -> None:
        self.provider = provider
        self.request = request or messages_request(kwargs)  # (the request as sent, read before it went out)
        self.start: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.stop_reason: Optional[str] = None
        self.usage: dict[str, Any] = {}
        self.token_ids: Optional[list[int]] = None
        self.logprobs: Optional[list[float]] = None
        self.stopped = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = event.message
            self.start = {"id": getattr(message, "id", None), "model": getattr(message, "model", None),
                          "prompt_token_ids": extra_field(message, "prompt_token_ids")}
            usage = _usage(getattr(message, "usage", None)) or {}
            self.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "content_block_start":
            self.blocks[event.index] = as_block(event.content_block)
        elif kind == "content_block_delta":
            block, delta = self.blocks.setdefault(event.index, {"type": "text", "text": ""}), as_block(event.delta)
            what = delta.get("type")
            if what == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif what == "input_json_delta":
                self.partial_json.setdefault(event.index, []).append(delta.get("partial_json", ""))
            elif what == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif what == "signature_delta":
                block["signature"] = delta.get("signature")
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            usage = getattr(event, "usage", None)
            done = getattr(usage, "output_tokens", None) if usage is not None else None
            if done is not None:
                self.usage["completion_tokens"] = done
            self.token_ids = extra_field(event, "token_ids") or self.token_ids
            self.logprobs = extra_field(event, "logprobs") or self.logprobs
        elif kind == "message_stop":
            self.stopped = True

    def _blocks(self) -> list[dict[str, Any]]:
        out = []
        for k in sorted(self.blocks):
            block = dict(self.blocks[k])
            if block.get("type") == "tool_use" and k in self.partial_json:
                text = "".join(self.partial_json[k])
                try:
                    block["input"] = json.loads(text) if text else {}
                except ValueError:
                    block["input"] = {"partial_json": text}  # cut in the middle
            out.append(block)
        return out

    def to_call(self, latency: float, left_early: bool, failure: Optional[str] = None) -> LLMCall:
        model, messages, tools, params = self.request
        incomplete = not self.stopped
        error = failure if incomplete and failure else (CUT if incomplete and not left_early else None)
        usage = dict(self.usage) or None
        if usage and isinstance(usage.get("prompt_tokens"), int) and isinstance(usage.get("completion_tokens"), int):
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        served_by = self.start.get("model")
        choice = _choice(self._blocks(), self.start.get("id"), self.stop_reason, self.token_ids, self.logprobs)
        return constructed(LLMCall, provider=self.provider, model=model, messages=messages, tools=tools,
                           params=params, choices=[choice], served_by=served_by, step=served_step(served_by),
                           usage=usage, prompt_token_ids=self.start.get("prompt_token_ids"), latency=latency,
                           stream=True, incomplete=incomplete, error=error)


def message_from_call(call: LLMCall) -> dict[str, Any]:
    """A recorded Messages call as a Message dict (for replay)."""
    message = call.message or {}
    blocks = message.get("blocks")
    if blocks is None:  # recorded from another API: its text and tool calls as blocks
        blocks = [{"type": "text", "text": message["content"]}] if isinstance(message.get("content"), str) else []
        blocks += [{"type": "tool_use", "id": tc.get("id"), "name": tc["function"]["name"],
                    "input": json.loads(tc["function"]["arguments"] or "{}")} for tc in message.get("tool_calls") or ()]
    usage = call.usage or {}
    return {"id": message.get("id") or "msg_replay", "type": "message", "role": "assistant",
            "model": call.served_by or call.model, "content": blocks,
            "stop_reason": message.get("stop_reason") or "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens") or 0, "output_tokens": usage.get("completion_tokens") or 0}}


def events_from_call(call: LLMCall) -> Iterable[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs that replay a recorded Messages call as a stream."""
    return message_events(message_from_call(call))


def message_events(message: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs that stream a Message: started, each block whole in one
    delta, the stop reason (with the answer's token ids, when the message has them), stopped."""
    extra = {k: message[k] for k in ("token_ids", "logprobs") if k in message}
    start = {k: v for k, v in message.items() if k not in ("token_ids", "logprobs")}
    yield "message_start", {"type": "message_start", "message": {**start, "content": [], "stop_reason": None}}
    for k, block in enumerate(message["content"]):
        kind = block.get("type")
        empty = {**block, "text": ""} if kind == "text" else {**block, "input": {}} if kind == "tool_use" else block
        yield "content_block_start", {"type": "content_block_start", "index": k, "content_block": empty}
        if kind == "text":
            yield "content_block_delta", {"type": "content_block_delta", "index": k,
                                          "delta": {"type": "text_delta", "text": block.get("text", "")}}
        elif kind == "tool_use":
            yield "content_block_delta", {"type": "content_block_delta", "index": k, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}}
        yield "content_block_stop", {"type": "content_block_stop", "index": k}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                               "stop_sequence": None},
                            "usage": {"output_tokens": message["usage"]["output_tokens"]}, **extra}
    yield "message_stop", {"type": "message_stop"}
