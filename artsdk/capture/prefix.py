"""A conversation's messages copied for the record, reusing the copies an earlier call of the
rollout made of the messages it sent too.

Each call records the conversation it sent as a copy, so that the agent appending to its list
or editing a message later does not rewrite what an earlier call sent. Copying every message on
every call would make the 20th turn cost twenty times the first; an agent resends what it sent
before plus a few new messages, so the copies a call made are kept on the rollout's recorder and
the next call reuses those of its messages that still say what they said.

"Still say": each message copied gets a witness, taken when it is copied, and the next call
compares its messages with their witnesses (one list comparison). A plain dict's witness is its
copy. A pydantic object's -- the ``ChatCompletionMessage`` or output item an agent appends from
a response, which never equals a dict -- is ``_Fields``: a copy of its type and fields, at any
depth, that equals the object while its fields say the same. An edit in place at any depth makes
a message differ from its witness, and it is copied anew.

The Responses and Messages APIs' chat views are made from those copies item by item
(``folded``), continuing the view the last call made of the copies the two calls share.
"""

from __future__ import annotations

from copy import deepcopy
from operator import is_
from typing import Any, Callable, Iterable

from pydantic import BaseModel

from .current import current_recorder

_NONE: tuple[list[Any], list[Any]] = ([], [])  # (only ever sliced)


def reused(key: str, items: Iterable[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """``[convert(m) for m in items]``, reusing the converted copies the rollout's last call
    under ``key`` made of a prefix of ``items`` that still says the same."""
    rec = current_recorder.get()
    items = list(items)
    if rec is None or rec.closed:
        return [convert(m) for m in items]
    copies, witnesses = rec.copies.get(key) or _NONE
    n = len(witnesses)
    if n and (n > len(items) or items[:n] != witnesses):
        n = _matching(items, witnesses)
    copies, witnesses = copies[:n], witnesses[:n]  # new lists: the last call keeps its own
    for m in items[n:]:
        copy = convert(m)
        copies.append(copy)
        witnesses.append(copy if type(m) is dict and copy == m else _witness(m))  # a plain dict: its copy
    rec.copies[key] = (copies, witnesses)
    return copies


def folded(key: str, head: list[Any], items: list[Any], step: Callable[[list[Any], Any], None]) -> list[Any]:
    """``out = list(head)``, then ``step(out, item)`` for each of ``items`` -- a view made item
    by item, whose step appends to ``out`` or replaces its last entry, never changing one in
    place -- continuing the view the rollout's last call under ``key`` made of the leading items
    the two calls share (the very copies ``reused`` handed both)."""
    rec = current_recorder.get()
    out = list(head)
    if rec is None or rec.closed:
        for item in items:
            step(out, item)
        return out
    n, ends, lasts = 0, [], []  # after each item: how long the view was, and its last entry
    prior = rec.copies.get(key)
    if prior is not None and prior[0] == head:
        _, before, view, ends, lasts = prior
        same = list(map(is_, items, before))
        n = same.index(False) if False in same else len(same)
        if n:
            out = view[:ends[n - 1]]
            if out:  # as it was then: a later item of that call may have replaced it
                out[-1] = lasts[n - 1]
        ends, lasts = ends[:n], lasts[:n]
    for item in items[n:]:
        step(out, item)
        ends.append(len(out))
        lasts.append(out[-1] if out else None)
    rec.copies[key] = (head, items, out, ends, lasts)
    return out


class _Fields:
    """A pydantic object's type and fields (its extra fields too), copied at any depth: equal
    to the object while they say the same. The object's own ``__eq__`` declines to compare
    itself with this, so Python asks this one."""

    __slots__ = ("kind", "fields", "extra")

    def __init__(self, obj: BaseModel) -> None:
        self.kind, self.fields, self.extra = type(obj), _snapshot(obj.__dict__), _snapshot(obj.__pydantic_extra__)

    def __eq__(self, other: object) -> bool:
        if type(other) is _Fields:
            return (self.kind, self.fields, self.extra) == (other.kind, other.fields, other.extra)
        return (type(other) is self.kind and other.__dict__ == self.fields
                and other.__pydantic_extra__ == self.extra)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class _Never:
    """The witness of a message no copy can vouch for: it equals nothing, so that message is
    copied anew at every call."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


_NEVER = _Never()
_ATOMS = frozenset({str, int, float, bool, type(None)})


def _witness(m: Any) -> Any:
    """What ``m`` (not a plain dict its copy equals) is compared with at the next call. (One
    whose copy does not equal it -- a deep-copied object of a kind compared by identity -- is
    copied anew at every call, as the witness that equals nothing makes it be.)"""
    try:
        return _snapshot(m)
    except Exception:  # noqa: BLE001 - a message that cannot be copied is copied at every call
        return _NEVER


def _snapshot(v: Any) -> Any:
    """A copy of ``v`` at any depth, equal to it while it says the same."""
    t = type(v)
    if t in _ATOMS:
        return v
    if t is dict:
        return {k: _snapshot(x) for k, x in v.items()}
    if t is list or t is tuple:
        return t(_snapshot(x) for x in v)
    if isinstance(v, BaseModel):
        return _Fields(v)
    return deepcopy(v)


def _matching(items: list[Any], witnesses: list[Any]) -> int:
    """How many leading messages still say what their witnesses say."""
    n = 0
    for m, w in zip(items, witnesses):
        if m != w:
            break
        n += 1
    return n
