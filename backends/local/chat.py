"""Between chat messages and tokens: prompts through the model's chat template, and the
model's text back into content and tool calls.

Tool calls use the Hermes / Qwen convention, ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``. A template that cannot render tools gets them described in a system message;
text that looks like a tool call but does not parse stays content (never an error).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from typing import Any, Optional

from artsdk.errors import TrajectoryError
from artsdk.trajectory import check_messages

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


def _tools_prompt(tools: list[dict[str, Any]]) -> str:
    lines = [json.dumps(t.get("function", t)) for t in tools]
    return ("You may call these tools. To call one, answer with "
            '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>.\n<tools>\n'
            + "\n".join(lines) + "\n</tools>")


def _as_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def message_text(message: dict[str, Any]) -> str:
    """A message's content with its tool calls written out as the model writes them."""
    text = _as_text(message.get("content"))
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", {})
        text += (f'<tool_call>{{"name": {json.dumps(fn.get("name"))}, '
                 f'"arguments": {fn.get("arguments") or "{}"}}}</tool_call>')
    return text


class ChatFormat:
    """Renders messages for one tokenizer and parses its model's answers."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        template = tokenizer.chat_template or ""
        self.native_tools = "tools" in template
        self.native_tool_calls = "tool_calls" in template
        found = [i for i in (tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS)
                 if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id]
        # the token that ends an assistant turn in this template (appended when retokenizing)
        self.end_id = found[0] if found else tokenizer.eos_token_id
        self.stop_ids = sorted({i for i in (tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS)
                                if isinstance(i, int) and i != tokenizer.unk_token_id and i >= 0}
                               | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
        # no token covers more characters than its vocabulary entry has: text longer than the context
        # times this cannot fit, whatever it is (a bound checked before rendering)
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
        self._lock = threading.Lock()  # a fast tokenizer is not to be used from two threads at once

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None) -> list[int]:
        """Token ids of the prompt, ending where the assistant's answer starts."""
        return self.encode(self.render(messages, tools, generation=True))

    def render(self, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]], generation: bool) -> str:
        """The conversation as the chat template writes it (``generation``: with the opening of
        the assistant's answer after it)."""
        msgs = self._normalize(check_messages(messages), tools)
        kwargs: dict[str, Any] = {"add_generation_prompt": generation, "tokenize": False}
        if tools and self.native_tools:
            kwargs["tools"] = tools
        try:
            return self.tok.apply_chat_template(msgs, **kwargs)
        except Exception as e:  # a template raising on unusual messages
            raise TrajectoryError(f"the chat template could not render these messages: {e}") from None

    def text_after(self, messages: list[dict[str, Any]], k: int, tools: Optional[list[dict[str, Any]]]) -> Optional[str]:
        """The prompt's text after the end token that closes the answer ``messages[k]`` (the
        template's own separator, the later turns, the opening of the next answer); None when
        the template does not render the conversation as the earlier one's text extended."""
        whole = self.render(messages, tools, generation=True)
        before = self.render(messages[:k + 1], tools, generation=False)
        end = self.tok.convert_ids_to_tokens(self.end_id)
        cut = before.rfind(end) if isinstance(end, str) else -1
        if cut < 0 or not whole.startswith(before[:cut + len(end)]):
            return None
        return whole[cut + len(end):]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added); safe from several threads."""
        with self._lock:
            return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _normalize(self, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            m = dict(m)
            if not self.native_tool_calls:
                text = message_text(m)
                m.pop("tool_calls", None)
                if m.get("role") == "tool":
                    m["role"] = "user"
                    text = f"<tool_response>\n{text}\n</tool_response>"
                    m.pop("tool_call_id", None)
                m["content"] = text
            elif m.get("content") is None:
                m["content"] = ""
            out.append(m)
        if tools and not self.native_tools:
            sys_text = _tools_prompt(tools)
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + sys_text}
            else:
                out.insert(0, {"role": "system", "content": sys_text})
        return out

    def parse(self, text: str, tools: Optional[list[dict[str, Any]]]) -> tuple[Optional[str], Optional[list[dict[str, Any]]]]:
        """(content, tool_calls) of an answer. Tool calls are parsed only when tools were
        offered; the answer stays content unless every call in it is a JSON object naming an
        offered tool, with arguments that are an object (or a string). Whatever the model
        wrote, this returns: its output is never an error."""
        if not tools or "<tool_call>" not in text:
            return text, None
        names = offered_names(tools)
        calls = []
        for raw in _TOOL_CALL.findall(text):
            call = _tool_call(raw, names)
            if call is None:
                return text, None
            calls.append(call)
        if not calls:
            return text, None
        rest = _TOOL_CALL.sub("", text).strip()
        return (rest or None), calls


def offered_names(tools: list[Any]) -> set[str]:
    """The names of the offered tools (chat shape ``{"function": {"name"}}`` or flat)."""
    names = set()
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names


def _tool_call(raw: str, names: set[str]) -> Optional[dict[str, Any]]:
    """One ``<tool_call>`` body as a chat tool call, or None when it is not a call of an
    offered tool (a name that is an object, arguments that are a list, not JSON at all)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name, args = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or name not in names:
        return None
    if args is None:
        args = {}
    if not isinstance(args, (dict, str)):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
