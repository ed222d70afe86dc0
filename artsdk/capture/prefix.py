"""A conversation's messages copied for the record, reusing the copies an earlier call of the
rollout made of the messages it sent too.

Each call records the conversation it sent as a copy, so that the agent appending to its list
or editing a message later does not rewrite what an earlier call sent. Copying every message on
every call would make the 20th turn cost twenty times the first; an agent resends what it sent
before plus a few new messages, so the copies a call made are kept on the rollout's recorder and
the next call reuses those of its messages that still say what they said.

"Still say": each message copied gets a witness, taken when it is copied, and the next call
compares its messages with their witnesses (one list comparison, at C speed). A plain dict's
witness is its copy. A pydantic object -- the ``ChatCompletionMessage`` or output item an agent
appends from a response, which never equals a dict -- is its own witness, and every pydantic
object in a message, at any depth, is kept beside it with a copy of its fields (containers
copied, the objects in them kept as they are): the next call compares each such object's fields
with their copy, also at C speed (``pydantic``'s ``__eq__``, Python run for each object, would
cost several times more once the client's own work has evicted it). An edit in place at any
depth makes a message differ from its witness or an object's fields from their copy, and that
message is copied anew.

The Responses and Messages APIs' chat views are made from those copies item by item
(``folded``), continuing the view the last call made of the copies the two calls share.

What the calls keep (each message's copy, witness..., each object's fields) is held in lists
the next call cuts back to what still holds and adds to, in place, under the recorder's lock.
A list the length of the conversation made and dropped on each call -- six of them, as each
call once made its own -- touches every message it holds (a reference counted, then let go),
each a cache miss after the client's own work: it made the 20th turn's paired overhead of a
dict conversation about 1.7 times the first's. The one list each call makes is the one it is
recorded with.
"""

from __future__ import annotations

from bisect import bisect_right
from copy import deepcopy
from operator import is_
from typing import Any, Callable, Iterable

from pydantic import BaseModel

from .current import current_recorder


def reused(key: str, items: Iterable[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """``[convert(m) for m in items]``, reusing the converted copies the rollout's last call
    under ``key`` made of a prefix of ``items`` that still says the same."""
    rec = current_recorder.get()
    if type(items) is not list:
        items = list(items)
    if rec is None or rec.closed:
        return [convert(m) for m in items]
    with rec.lock:  # (the threads of one rollout share what its calls left)
        kept = rec.copies.get(key)
        if kept is None:
            kept = rec.copies[key] = ([], [], [], [], [], [])
        return _reused(kept, items, convert)


def _reused(kept: tuple[list[Any], ...], items: list[Any], convert: Callable[[Any], Any]) -> list[Any]:
    # per message: its copy, its witness, and how many objects the messages up to it hold;
    # per object in them: the object, and copies of its fields and extra fields. Kept from call
    # to call and cut or added to in place: a call that resends the last one's messages and adds
    # a few makes no list the length of the conversation but the one it records
    copies, witnesses, ends, objects, fields, extras = kept
    n = len(witnesses)
    if n and (n > len(items) or items[:n] != witnesses):
        n = _cut(kept, _matching(items, witnesses))
    if objects and ([o.__dict__ for o in objects] != fields or
                    [o.__pydantic_extra__ or None for o in objects] != extras):
        n = _cut(kept, bisect_right(ends, _first_changed(objects, fields, extras)))
    for m in items[n:]:
        copy = convert(m)
        copies.append(copy)
        if type(m) is dict and copy == m:  # a plain dict: its copy says what it says
            witnesses.append(copy)
        else:
            try:
                witnesses.append(_snapshot(m, (objects, fields, extras)))
            except Exception:  # noqa: BLE001 - a message that cannot be copied is copied at every call
                start = ends[-1] if ends else 0  # (the objects it had added so far let go)
                del objects[start:], fields[start:], extras[start:]
                witnesses.append(_NEVER)
        ends.append(len(objects))
    return copies[:]  # the call's own list: the next call changes these


def _cut(kept: tuple[list[Any], ...], n: int) -> int:
    """Keep what the first ``n`` messages left in ``kept`` (``reused``'s lists), and the
    objects in them; returns ``n``."""
    copies, witnesses, ends, objects, fields, extras = kept
    del copies[n:], witnesses[n:], ends[n:]
    k = ends[-1] if ends else 0
    del objects[k:], fields[k:], extras[k:]
    return n


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
    with rec.lock:
        n, ends, lasts = 0, [], []  # after each item: how long the view was, and its last entry
        prior = rec.copies.get(key)
        if prior is not None and prior[0] == head:
            _, before, view, ends, lasts = prior  # (ends and lasts cut and added to in place, as reused's)
            same = list(map(is_, items, before))
            n = same.index(False) if False in same else len(same)
            if n:
                out = view[:ends[n - 1]]
                if out:  # as it was then: a later item of that call may have replaced it
                    out[-1] = lasts[n - 1]
            del ends[n:], lasts[n:]
        for item in items[n:]:
            step(out, item)
            ends.append(len(out))
            lasts.append(out[-1] if out else None)
        rec.copies[key] = (head, items, out, ends, lasts)
        return out


class _Never:
    """The witness of a message no copy can vouch for: it equals nothing, so that message is
    copied anew at every call."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


_NEVER = _Never()
_ATOMS = frozenset({str, int, float, bool, type(None)})


def _snapshot(v: Any, kept: tuple[list[Any], list[Any], list[Any]]) -> Any:
    """``v`` with its containers copied at any depth and the pydantic objects in them kept as
    they are, each added to ``kept`` (objects, copies of their fields, of their extra fields);
    any other object deep-copied."""
    t = type(v)
    if t in _ATOMS:
        return v
    if t is dict:  # (an atom in it taken as it is, without a call: most of an object's fields are)
        return {k: x if type(x) in _ATOMS else _snapshot(x, kept) for k, x in v.items()}
    if t is list or t is tuple:
        return t([x if type(x) in _ATOMS else _snapshot(x, kept) for x in v])
    if isinstance(v, BaseModel):
        objects, fields, extras = kept
        at = len(objects)
        objects.append(v)
        fields.append(None)
        extras.append(None)
        # (no extra fields, the usual case, kept as None: compared without a copy to read)
        fields[at], extras[at] = _snapshot(v.__dict__, kept), _snapshot(v.__pydantic_extra__ or None, kept)
        return v
    return deepcopy(v)


def _first_changed(objects: list[Any], fields: list[Any], extras: list[Any]) -> int:
    """The first of ``objects`` whose fields no longer say what their copies say."""
    for i, o in enumerate(objects):
        if o.__dict__ != fields[i] or (o.__pydantic_extra__ or None) != extras[i]:
            return i
    return len(objects)


def _matching(items: list[Any], witnesses: list[Any]) -> int:
    """How many leading messages still say what their witnesses say."""
    n = 0
    for m, w in zip(items, witnesses):
        if m != w:
            break
        n += 1
    return n
