"""Token-in continuation: a conversation's next prompt carries the exact tokens this server
sampled for its earlier assistant turns, not a re-rendering of their text.

Re-rendering an answer from its text through the chat template can give other tokens than
the model sampled (a tool call the template lays out differently, a merge the tokenizer makes
across the boundary), and then the trajectory's calls no longer extend one another: the
conversation trains as several segments, and whatever differs is trained on as if sampled.
So every answer is remembered -- the conversation up to it (the messages, the answer as sent
back, the tools) and the tokens of its prompt and its sampling -- and a later request whose
messages start with such a conversation gets those tokens, followed by the chat template's
rendering of what came after the answer. Where the agent changed its history (an edited
answer, a dropped turn), nothing matches and the prompt is rendered from the text, as before.
The prefix cache then finds the whole earlier conversation's keys under those very tokens.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, Optional

KEPT = 4096  # answers remembered per model, least recently used first


def canonical(message: dict[str, Any]) -> Any:
    """What a message says, as the chat template reads it: role, text, tool calls by name and
    arguments (parsed), the tool call a result answers. Fields clients add (refusal, audio,
    annotations) and the formatting of arguments do not count."""
    calls = []
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                pass
            calls.append([fn.get("name"), args])
    content = message.get("content")
    return [message.get("role"), content if content not in ("", None) else None, calls or None,
            message.get("tool_call_id"), message.get("name")]


def _key(messages: list[dict[str, Any]], tools: Any) -> str:
    text = json.dumps([[canonical(m) for m in messages], tools], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class Continuations:
    """The answers of one model's server, by the conversation that led to them."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat  # the model's ChatFormat: its template, tokenizer and end token
        self._kept: "OrderedDict[str, list[int]]" = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, messages: list[dict[str, Any]], tools: Any, prompt: list[int], sampled: list[int],
                 answer: dict[str, Any]) -> None:
        """The answer ``answer`` to ``messages`` came from ``prompt`` + ``sampled``."""
        tokens = list(prompt) + list(sampled)
        if not sampled or sampled[-1] != self.chat.end_id:
            tokens.append(self.chat.end_id)  # cut at max_tokens (or another stop): the template closes the turn
        with self._lock:
            self._kept[_key([*messages, answer], tools)] = tokens
            self._kept.move_to_end(_key([*messages, answer], tools))
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any) -> tuple[list[int], Optional[int]]:
        """(the prompt's token ids, how many messages of it came from a remembered answer's
        tokens: None when none did and the whole prompt was rendered from text)."""
        with self._lock:
            found = None
            for k in range(len(messages) - 1, 0, -1):
                if messages[k].get("role") != "assistant":
                    continue
                tokens = self._kept.get(_key(messages[:k + 1], tools))
                if tokens is not None:
                    found = (k, tokens)
                    self._kept.move_to_end(_key(messages[:k + 1], tools))
                    break
        if found is None:
            return self.chat.prompt_ids(messages, tools), None
        k, tokens = found
        rest = self.chat.text_after(messages, k, tools)
        if rest is None:  # the template does not extend a conversation by appending to its text
            return self.chat.prompt_ids(messages, tools), None
        return tokens + self.chat.encode(rest), k + 1
