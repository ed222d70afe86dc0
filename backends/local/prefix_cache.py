"""The built-in engine's prefix cache: the keys and values a generation computed, kept by the
token ids they were computed for and the adapter step that computed them, so that a later
request whose prompt starts with those tokens -- the next turn of a conversation, another
member of a GRPO group, a system prompt every rollout shares -- computes only the rest.

An entry is the whole sequence a choice ended with (its prompt and the tokens it sampled, but
the last, whose keys were never computed); a prompt reuses the longest prefix any entry of its
step shares with it, always leaving its last token to compute (its logits are what the first
new token is sampled from). A new step never reuses an older step's keys: the weights differ.
Entries are evicted least recently used first, to stay within ``budget`` bytes; a retired
step's entries go at once.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Entry:
    step: int
    tokens: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values, [kv heads, tokens, head dim]
    nbytes: int


class PrefixCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: "OrderedDict[int, Entry]" = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        self.stats = {"lookups": 0, "hits": 0, "tokens_reused": 0, "tokens_asked": 0, "evicted": 0}

    def lookup(self, step: int, prompt: tuple[int, ...]) -> tuple[int, Optional[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """(how many leading tokens of ``prompt`` are cached, their keys and values per layer);
        (0, None) when none are."""
        best, found = 0, None
        with self._lock:
            self.stats["lookups"] += 1
            self.stats["tokens_asked"] += len(prompt)
            for key, e in self._entries.items():
                if e.step != step or not e.tokens or e.tokens[0] != prompt[0]:
                    continue
                n = min(_common(e.tokens, prompt), len(prompt) - 1)
                if n > best:
                    best, found = n, key
            if found is None:
                return 0, None
            self._entries.move_to_end(found)
            entry = self._entries[found]
            self.stats["hits"] += 1
            self.stats["tokens_reused"] += best
        return best, [(k[:, :best], v[:, :best]) for k, v in entry.kv]

    def store(self, step: int, tokens: tuple[int, ...], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``kv``, computed by ``step`` for ``tokens``; an entry it extends is dropped."""
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if not tokens or nbytes > self.budget:
            return
        with self._lock:
            for key, e in list(self._entries.items()):
                if e.step == step and len(e.tokens) <= len(tokens) and tokens[:len(e.tokens)] == e.tokens:
                    self._drop(key)  # superseded: the new entry holds all of it
            self._entries[self._next] = Entry(step, tokens, kv, nbytes)
            self._next += 1
            self.used += nbytes
            while self.used > self.budget and self._entries:
                self._drop(next(iter(self._entries)))
                self.stats["evicted"] += 1

    def retire(self, step: int) -> None:
        """``step`` is served no more: its entries go."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.step == step]:
                self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used = 0

    def _drop(self, key: int) -> None:
        self.used -= self._entries.pop(key).nbytes


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return len(os.path.commonprefix([a, b]))
