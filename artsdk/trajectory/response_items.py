"""Between the OpenAI Responses API's items and chat messages.

The Responses API speaks in items: an ``input`` of messages, ``function_call`` and
``function_call_output`` items (and reasoning items), ``instructions`` beside it, and an
``output`` of items. Trajectories keep the items as they were sent and received, and a chat
view of them -- the shape the rest of artsdk (rewards, replay, training, the local backend's
chat template) reads:

    instructions                      -> {"role": "system", ...} first
    {"role": ..., "content": ...}     -> that message, its text parts joined
    function_call (one or several)    -> an assistant message with tool_calls
    function_call_output              -> {"role": "tool", "tool_call_id": ..., "content": ...}
    reasoning, other items            -> kept in the items, left out of the chat view

    >>> chat_messages([{"role": "user", "content": "hi"}], instructions="Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

Item = dict[str, Any]

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")


def plain(value: Any) -> Any:
    """``value`` with every pydantic object in it (at any depth) dumped to dicts; dicts and
    lists copied, everything else as it is."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if dump is not None and callable(dump):
        try:
            return plain(dump(exclude_none=True))
        except TypeError:  # a model_dump of another kind
            return value
    return value


def as_item(x: Any) -> Item:
    """A request or response item (dict or openai object) as a plain dict."""
    if isinstance(x, dict):  # copied all the way down: the caller may change its parts later
        return plain(x)
    dump = getattr(x, "model_dump", None)
    if dump is not None:
        return dump(exclude_none=True)
    return {"type": type(x).__name__, "value": str(x)}


def items_of(input: Any) -> list[Item]:
    """The request's ``input`` as a list of items (a bare string is one user message)."""
    if input is None or type(input).__name__ in ("Omit", "NotGiven"):
        return []
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    return [as_item(x) for x in input]


def _text(content: Any) -> Any:
    """Message content as chat content: a string when it is all text, else the parts (content
    that is neither, which the server will refuse, as it is)."""
    if not isinstance(content, (list, tuple)):
        return content
    parts = [as_item(p) for p in content]
    if all(p.get("type") in _TEXT_PARTS for p in parts):
        return "".join(str(p.get("text", "")) for p in parts)
    return [{"type": "text", "text": p.get("text", "")} if p.get("type") in _TEXT_PARTS else p for p in parts]


def chat_messages(items: Iterable[Item], instructions: Optional[str] = None) -> list[Item]:
    """The chat view of Responses input (or output) items."""
    out = chat_head(instructions)
    for item in items:
        add_chat_message(out, item)
    return out


def chat_head(instructions: Optional[str]) -> list[Item]:
    """What the chat view starts with: the instructions as a system message."""
    return [{"role": "system", "content": instructions}] if instructions else []


def add_chat_message(out: list[Item], item: Item) -> None:
    """Add ``item``'s part of the chat view to ``out``: a message appended, or a function call
    joined to the assistant message before it -- in a copy that replaces it, so that a view an
    earlier call recorded, which holds that message too, is left as it was."""
    kind = item.get("type")
    if kind == "function_call":
        call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
        last = out[-1] if out else None
        if last is not None and last.get("role") == "assistant":
            out[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or ()), call]}  # one turn: its text and calls
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else _text(output)})
    elif kind in (None, "message") and "role" in item:
        out.append({"role": item["role"], "content": _text(item.get("content"))})


def chat_tools(tools: Any) -> Optional[list[Item]]:
    """Responses function tools (``{"type": "function", "name": ...}``) in chat form
    (``{"type": "function", "function": {"name": ...}}``); other tools as they are."""
    if tools is None or type(tools).__name__ in ("Omit", "NotGiven"):
        return None
    out = []
    for t in (as_item(x) for x in tools):
        if t.get("type") == "function" and "function" not in t:
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            out.append({"type": "function", "function": fn})
        else:
            out.append(t)
    return out


def assistant_message(output: Iterable[Item]) -> Item:
    """One assistant chat message from a response's output items: its text, and its
    function calls as tool_calls (reasoning and other items are left out)."""
    text, calls = [], []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            content = _text(item.get("content"))
            if isinstance(content, str):
                text.append(content)
        elif kind == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}})
    message: Item = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def output_items(content: Optional[str], tool_calls: Optional[list[Item]], id_prefix: str) -> list[Item]:
    """A response's output items for an assistant turn of text and tool calls (what a
    server answering the Responses API from a chat model sends)."""
    items: list[Item] = []
    if content:
        items.append({"type": "message", "id": f"msg_{id_prefix}", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": content, "annotations": []}]})
    for k, tc in enumerate(tool_calls or ()):
        fn = tc["function"]
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
        items.append({"type": "function_call", "id": f"fc_{id_prefix}_{k}", "call_id": tc["id"],
                      "name": fn["name"], "arguments": args, "status": "completed"})
    return items


def whole_conversation(calls: list[Any], call: Any) -> list[Item]:
    """The chat messages a Responses call really answered: its own, after the conversation of
    the response it continues (``previous_response_id``), found among ``calls`` (the
    trajectory's, recorded earlier). TrajectoryError when that response is not there: the
    server kept the beginning, and nothing recorded holds it."""
    from ..errors import TrajectoryError

    messages = list(call.messages)
    previous = call.params.get("previous_response_id")
    seen = set()
    while previous:
        if previous in seen:
            break
        seen.add(previous)
        earlier = next((c for c in calls if c.choices and c.choices[0].message.get("id") == previous), None)
        if earlier is None:
            raise TrajectoryError(
                f"call {call.index} continues response {previous!r} (previous_response_id), which is not among the "
                f"trajectory's recorded calls: the start of its conversation is unknown. Send the whole "
                f"conversation as input, or let an artsdk backend answer (it returns the prompt's token ids)")
        answer = {k: v for k, v in earlier.choices[0].message.items() if k not in ("output", "id")}
        own = [m for m in messages if m.get("role") != "system"] if earlier is not call else messages
        system = [m for m in messages if m.get("role") == "system"]
        messages = system + [m for m in earlier.messages if m.get("role") != "system"] + [answer] + own
        previous = earlier.params.get("previous_response_id")
    return messages

