"""Which rollout an LLM call belongs to, and where a trainable model's calls go.

The patched clients look both up on every call (and the replay's recording, in
``cassette.py``), so the common case (no rollout, no session) costs one ContextVar read and
one dict check.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..trajectory.records import assigned
from . import current
from .cassette import current_cassette
from .current import current_recorder  # re-exported: defined below record.py, which reads it too
from .record import failed_call

if TYPE_CHECKING:
    from ..trajectory.records import LLMCall


class Recorder:
    """Collects the calls of one running rollout. Calls keep the order they were *made*
    in (each takes its slot when it starts), also when concurrent calls or streams finish
    out of order. A call made after the rollout ended is not added, and is logged."""

    __slots__ = ("calls", "notes", "refused", "seed", "rollout_id", "closed", "pid", "copies", "children", "kept",
                 "_pending", "_lock")

    def __init__(self, seed: Optional[int] = None, rollout_id: Optional[str] = None) -> None:
        self.calls: list[Optional[LLMCall]] = []
        self.notes: list[str] = []  # what capture could not record (see sentinel.py)
        self.refused: Optional[str] = None  # the first call strict capture refused to send (sentinel.py)
        self.seed = seed  # set by art.gather in a session: the rollout's calls sample reproducibly
        self.rollout_id = rollout_id  # the trajectory's id: sent to the backend with its calls
        self.closed = False
        self.pid = current.pid  # a forked child inherits the context, not the rollout: it records nothing
        self.copies: dict[str, Any] = {}  # the last call's messages and their copies (record.copied)
        self.children: list[str] = []  # the rollouts run inside this one: their calls are on their trajectories
        self.kept = True  # whether this rollout's trajectory will be stored (a plain call's may not be)
        self._pending: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()

    @property
    def lock(self) -> threading.Lock:
        """Held while a call changes what the rollout's calls keep (``copies``: prefix.py)."""
        return self._lock

    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def reserve(self, finish: Optional[Callable[[], None]] = None) -> int:
        """Hold the next slot for a call that has started (its number, in the order calls are
        made); ``finish`` records what arrived so far if the rollout ends first."""
        with self._lock:
            self.calls.append(None)
            i = len(self.calls) - 1
            if finish is not None:
                self._pending[i] = finish
            return i

    def on_close(self, slot: int, finish: Callable[[], None]) -> None:
        """Have ``finish`` record slot ``slot`` if the rollout ends before its answer does."""
        with self._lock:
            self._pending[slot] = finish

    def fill(self, slot: int, call: LLMCall) -> None:
        with self._lock:
            self._pending.pop(slot, None)
            assigned(call, index=slot)  # (pydantic's own assignment costs several times as much, on every call)
            if self.closed:
                late = True
            else:
                late = False
                self.calls[slot] = call
        if late:
            _late(self, call)

    def add(self, call: LLMCall) -> None:
        with self._lock:
            if not self.closed:
                assigned(call, index=len(self.calls))
                self.calls.append(call)
                return
        _late(self, call)

    def close(self) -> list[LLMCall]:
        """Finish streams the agent abandoned and return the calls in order; from now on, a
        call that ends is logged as made after the rollout, not added."""
        if self._pending:  # streams still open (a finish registered from now on is too late either way)
            with self._lock:
                pending = list(self._pending.values())
            for finish in pending:
                finish()
        with self._lock:
            self.closed = True
            calls = [c for c in self.calls if c is not None]
            # a copy of the rollout's context can outlive it (a worker thread it started serves on):
            # what that holds of the recording is no longer its calls and conversation
            self.calls, self.copies = [], {}
            return calls


def _late(rec: Recorder, call: Optional[LLMCall], model: Any = None) -> None:
    import logging

    what = "started" if call is None else "ended"
    logging.getLogger("artsdk.capture").warning(
        "a call to %s %s after its rollout (trajectory %s) had returned: it is not on the trajectory. Await "
        "every task or thread that calls a model before the rollout returns", model if call is None else
        (call.served_by or call.model), what, rec.rollout_id)


# Set while a patched call runs, so a client that calls another patched client internally
# (litellm -> openai) is recorded once, by the outer patch.
inside_call: ContextVar[bool] = ContextVar("artsdk_inside_call", default=False)


class one_call:  # noqa: N801 - used as a function: ``with one_call(...) as call:``
    """Around one patched LLM call inside a rollout. Entered, it gives itself: ``rec`` (the
    rollout's recorder, None outside one), ``slot`` (the call's number in the order calls are
    made), ``t0`` (the start time), ``kwargs`` (the call's arguments as they go out: inside a
    rollout, any that can be read only once made a list, and ``prepare(kwargs, slot)`` when
    given, e.g. ``for_backend``) and ``sent`` (their
    ``request(kwargs)`` -- model, messages, tools, params -- read now, before the call goes
    out, for its record: a task of the agent's may change the message list while the call
    waits for its answer, and the call is recorded with what it sent). It marks the call as
    running (``inside_call``); if the call raises, records it as a failed call with what it
    sent, and notes a misspelt model name on the exception. (A class: it runs on every call,
    and a generator-based context manager costs several times what it does.)"""

    __slots__ = ("provider", "kwargs", "request", "prepare", "rec", "slot", "t0", "sent", "token")

    def __init__(self, provider: str, kwargs: dict[str, Any], request: Callable[[dict[str, Any]], Any],
                 prepare: Optional[Callable[[dict[str, Any], int], dict[str, Any]]] = None) -> None:
        self.provider, self.kwargs, self.request, self.prepare = provider, kwargs, request, prepare

    def __enter__(self) -> "one_call":
        rec = current_recorder.get()
        if rec is not None and rec.pid != current.pid:
            rec = None  # a forked child: its calls reach the rollout by its art.rollout_env() URL, if at all
        slot = rec.reserve() if rec is not None and not rec.closed else -1
        if rec is not None and slot < 0:  # the rollout has returned: said here (and by the endpoint, as late)
            _late(rec, None, self.kwargs.get("model"))
            rec = None
        self.rec, self.slot = rec, slot
        if rec is not None:
            self.kwargs = _read_once(self.kwargs)
        if self.prepare is not None:
            self.kwargs = self.prepare(self.kwargs, slot)
        self.sent = self.request(self.kwargs) if rec is not None else None
        self.token = inside_call.set(True)
        self.t0 = perf_counter()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        inside_call.reset(self.token)
        if exc is not None:
            if self.rec is not None:
                self.rec.fill(self.slot, failed_call(self.provider, self.kwargs, exc, perf_counter() - self.t0,
                                                      self.sent))
            hint_misspelt_model(exc, self.kwargs.get("model"))


_READ_AGAIN = frozenset({list, dict, str, tuple, int, float, bool, type(None)})  # (the usual arguments' types)


def _read_once(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with each argument that can be read only once (an iterator) made a list: the
    clients take their messages as any iterable (``messages=(m for m in history)``), and the
    record reads them before the client does; both then read the list."""
    for v in kwargs.values():
        if type(v) not in _READ_AGAIN and isinstance(v, Iterator):
            return {k: list(x) if type(x) not in _READ_AGAIN and isinstance(x, Iterator) else x
                    for k, x in kwargs.items()}
    return kwargs


@dataclass(frozen=True)
class Route:
    """Where calls naming a trainable model are sent during a session."""

    base_url: str
    api_key: str = "artsdk"
    served_model: Optional[str] = None


# model name -> Route. Module-global (not a ContextVar) on purpose: a session must reach
# calls made from any task or thread started while it is open.
routes: dict[str, Route] = {}


def route_for(model: Any) -> Optional[tuple[Route, str]]:
    """Where a call naming ``model`` goes during a session, and the model name to send: a
    trainable model's name exactly (its newest step), or ``name@step`` (that step)."""
    if not routes or not isinstance(model, str):
        return None
    route = routes.get(model)
    if route is not None:
        return route, route.served_model or model
    name, at, step = model.partition("@")
    route = routes.get(name) if at and step.isascii() and step.isdigit() else None
    return (route, f"{route.served_model or name}@{step}") if route is not None else None


def with_sample_seed(kwargs: dict[str, Any], slot: Optional[int] = None) -> dict[str, Any]:
    """``kwargs`` of a call routed to a trainable model, with a sampling seed when the agent
    gave none and its rollout has one (``art.gather`` in a session sets it from the run's seed,
    the step, the group and the sample): the run then samples the same tokens whatever the
    batching or the order requests arrive in. It travels in ``extra_body``, which both the
    chat and the Responses API send as is."""
    rec = current_recorder.get()
    extra = kwargs.get("extra_body") or {}
    if rec is None or rec.seed is None or "seed" in kwargs or not isinstance(extra, dict) or "seed" in extra:
        return kwargs
    number = slot if slot is not None and slot >= 0 else len(rec.calls)  # the call's number in its rollout
    return {**kwargs, "extra_body": {**extra, "seed": (rec.seed + 7919 * number) % 2**31}}


ROLLOUT_HEADER = "X-Artsdk-Rollout"
CALL_HEADER = "X-Artsdk-Call"


def for_backend(kwargs: dict[str, Any], slot: Optional[int] = None) -> dict[str, Any]:
    """``kwargs`` of a call routed to a trainable model: with a sampling seed
    (``with_sample_seed``), and the rollout's id and the call's number in headers: by the id a
    backend with several inference replicas keeps a rollout's calls on one (its prefix cache
    stays warm), and the endpoint files its own record of the call, which the number matches
    with this one (``artsdk/rollout/reconcile.py``)."""
    kwargs = with_sample_seed(kwargs, slot)
    rec = current_recorder.get()
    headers = kwargs.get("extra_headers") or {}
    if rec is None or rec.rollout_id is None or not isinstance(headers, dict) or ROLLOUT_HEADER in headers:
        return kwargs
    mine = {ROLLOUT_HEADER: rec.rollout_id, **({CALL_HEADER: str(slot)} if slot is not None and slot >= 0 else {})}
    return {**kwargs, "extra_headers": {**headers, **mine}}


def hint_misspelt_model(exc: BaseException, model: Any) -> None:
    """A call that failed while a session is open, naming a model one edit away from a
    trainable one: say so on the exception (it went to the client's own server instead)."""
    if not routes or not isinstance(model, str) or model in routes:
        return
    for name in routes:
        if _one_edit(model, name):
            exc.add_note(f"artsdk: {model!r} is not the trainable model {name!r} of the open session, so this "
                         f"call went to the client's own server; calls reach the backend only when model= "
                         f"names the trainable model exactly")
            return


def _one_edit(a: str, b: str) -> bool:
    """True when a and b differ by one insertion, deletion, substitution or swap."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    i = next((k for k, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1:]




def active() -> bool:
    """True when a patched call has anything to do besides passing through."""
    return (
        current_recorder.get() is not None
        or bool(routes)
        or current_cassette.get() is not None
    ) and not inside_call.get()
