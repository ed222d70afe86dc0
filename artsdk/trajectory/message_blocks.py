"""Between Anthropic's Messages API and chat messages.

The Messages API speaks in content blocks: a ``system`` beside the ``messages``, each message's
content a string or a list of blocks -- ``text``, ``image``, ``tool_use`` (the assistant calls a
tool), ``tool_result`` (the user answers it), ``thinking`` -- and tools as ``{"name",
"description", "input_schema"}``. Trajectories keep the blocks as they were sent and received,
and a chat view of them -- the shape the rest of artsdk (rewards, replay, training, the local
backend's chat template) reads:

    system (text or text blocks)      -> {"role": "system", ...} first
    text blocks                       -> the message's content, joined
    tool_use blocks                   -> the assistant message's tool_calls (input as JSON text)
    tool_result blocks                -> {"role": "tool", "tool_call_id": ..., "content": ...}
    image and other blocks            -> content parts, as they are
    thinking, redacted_thinking       -> kept in the blocks, left out of the chat view

    >>> chat_messages([{"role": "user", "content": "hi"}], system="Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from .response_items import as_item, chat_head

Block = dict[str, Any]

_LEFT_OUT = ("thinking", "redacted_thinking")


as_block = as_item  # a block, message or tool (dict or anthropic object) as a plain dict


def blocks_of(content: Any) -> list[Block]:
    """A message's content as a list of blocks (a bare string is one text block)."""
    if content is None or type(content).__name__ in ("Omit", "NotGiven"):
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [as_block(b) for b in content]


def system_text(system: Any) -> Optional[str]:
    """The ``system`` parameter (text, or text blocks) as one text; None when absent."""
    if system is None or type(system).__name__ in ("Omit", "NotGiven"):
        return None
    if isinstance(system, str):
        return system or None
    return "".join(str(b.get("text", "")) for b in blocks_of(system) if b.get("type") == "text") or None


def _content(blocks: list[Block]) -> Any:
    """Chat content of non-tool blocks: a string when all are text, else the parts."""
    if all(b.get("type") == "text" for b in blocks):
        return "".join(str(b.get("text", "")) for b in blocks)
    return [{"type": "text", "text": b.get("text", "")} if b.get("type") == "text" else b for b in blocks]


def _tool_call(block: Block) -> Block:
    args = block.get("input")
    return {"id": block.get("id"), "type": "function",
            "function": {"name": block.get("name"), "arguments": json.dumps(args if args is not None else {})}}


def chat_messages(messages: Iterable[Any], system: Any = None) -> list[Block]:
    """The chat view of a Messages request's ``messages`` (and ``system``)."""
    out = chat_head(system_text(system))
    for message in messages:
        add_chat_messages(out, as_block(message))
    return out


def add_chat_messages(out: list[Block], message: Block) -> None:
    """Append the chat messages one Messages message (a plain dict) stands for to ``out``."""
    role = message.get("role")
    blocks = blocks_of(message.get("content"))
    if role == "assistant":
        out.append(assistant_message(blocks))
        return
    pending: list[Block] = []  # the user's own blocks, kept in their order around tool results
    for b in blocks:
        kind = b.get("type")
        if kind == "tool_result":
            if pending:
                out.append({"role": role, "content": _content(pending)})
                pending = []
            result = b.get("content")
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                        "content": result if isinstance(result, str) or result is None
                        else _content(blocks_of(result))})
        elif kind not in _LEFT_OUT:
            pending.append(b)
    if pending or not blocks:
        out.append({"role": role, "content": _content(pending)})


def assistant_message(blocks: Iterable[Block]) -> Block:
    """One assistant chat message from content blocks: the text, and the tool_use blocks as
    tool_calls (thinking left out)."""
    parts, calls = [], []
    for b in blocks:
        kind = b.get("type")
        if kind == "tool_use":
            calls.append(_tool_call(b))
        elif kind not in _LEFT_OUT:
            parts.append(b)
    content = _content(parts) if parts else None
    message: Block = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_tools(tools: Any) -> Optional[list[Block]]:
    """Messages API tools (``{"name", "description", "input_schema"}``) in chat form
    (``{"type": "function", "function": {"name", "description", "parameters"}}``); server
    tools (``{"type": "web_search_20250305", ...}``) as they are."""
    if tools is None or type(tools).__name__ in ("Omit", "NotGiven"):
        return None
    out = []
    for t in (as_block(x) for x in tools):
        if t.get("type") in (None, "custom") and "name" in t:
            fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
            if t.get("description"):
                fn["description"] = t["description"]
            out.append({"type": "function", "function": fn})
        else:
            out.append(t)
    return out


def content_blocks(content: Optional[str], tool_calls: Optional[list[Block]], id_prefix: str) -> Optional[list[Block]]:
    """An answer's content blocks for an assistant turn of text and tool calls (what a server
    answering the Messages API from a chat model sends). A call whose arguments are not a JSON
    object cannot be a tool_use block: None then, and the caller answers with the text."""
    blocks: list[Block] = [{"type": "text", "text": content}] if content else []
    for k, tc in enumerate(tool_calls or ()):
        fn = tc["function"]
        args = fn["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        blocks.append({"type": "tool_use", "id": tc.get("id") or f"toolu_{id_prefix}_{k}", "name": fn["name"],
                       "input": args})
    return blocks
