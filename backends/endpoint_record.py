"""What the endpoint saw: every call a backend's server answers for a trainable model, kept by
the rollout that made it, so that no call is lost whatever made it -- a patched client in
the rollout, a child process, ``curl``, a library that sends from native code.

A call names its rollout by the ``X-Artsdk-Rollout`` header artsdk's patches send (with
``X-Artsdk-Call``, the client's number for the call), or by the per-rollout base URL
``<server>/r/<rollout id>/v1`` that ``art.rollout_env()`` hands to code artsdk does not
patch. At the end of a rollout the client takes the rollout's record (``take``) and
reconciles it with its own (``artsdk/rollout/reconcile.py``). A call with no rollout is logged
with its model and time, never dropped silently. A call to an ended rollout's path is refused
(410): it would be on no trajectory; one that names an ended rollout by header (a task the
rollout did not wait for) is answered. Either is logged once per rollout, with how many came.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from typing import Any, Awaitable, Callable, Optional

from artsdk.trajectory import Choice, LLMCall

from .http import error

log = logging.getLogger("artsdk.endpoint")

ROLLOUT_HEADER = "x-artsdk-rollout"
CALL_HEADER = "x-artsdk-call"
VIA_HEADER = "x-artsdk-via"  # set by the per-rollout path: how the rollout was named
_PATH = re.compile(r"^/r/([A-Za-z0-9_-]{1,64})(/.*)$")
MAX_ROLLOUTS = 10_000  # rollouts kept waiting to be taken; the oldest beyond this are logged and let go
MAX_ENDED = 100_000  # ended rollouts remembered, so a late call is told apart from an unknown one


class EndpointRecord:
    """The calls a server answered, by rollout. Thread-safe: routes add from the event loop,
    rollouts take from theirs."""

    def __init__(self) -> None:
        self._calls: "collections.OrderedDict[str, list[LLMCall]]" = collections.OrderedDict()
        # ended rollouts -> whether a late call to them was logged (once per rollout)
        self._ended: "collections.OrderedDict[str, bool]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.unclaimed = 0  # calls that named no rollout
        self.late = 0  # calls for a rollout that had ended

    def add(self, rollout: Optional[str], call: LLMCall) -> None:
        """Keep ``call`` for ``rollout`` (None: the request named none)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            if rollout is None:
                self.unclaimed += 1
            elif rollout in self._ended:
                self.late += 1
                if self._ended[rollout]:
                    return  # said once for this rollout already
                self._ended[rollout] = True
            else:
                self._calls.setdefault(rollout, []).append(call)
                while len(self._calls) > MAX_ROLLOUTS:
                    old, calls = self._calls.popitem(last=False)
                    log.warning("the endpoint's record of rollout %s (%d call(s)) was never taken; let go",
                                old, len(calls))
                return
        if rollout is None:
            log.info("a call to %s at %s named no rollout: it is on no trajectory (calls from a rollout's "
                     "patched clients, or sent to its art.rollout_env() URL, are)", call.served_by, when)
        else:
            log.warning("a call to %s at %s arrived for rollout %s after it had ended: it is not on its "
                        "trajectory (was it made by a task or thread the rollout did not wait for?); later "
                        "ones for this rollout are counted, not logged", call.served_by, when, rollout)

    def refuse_late(self, rollout: str) -> bool:
        """Whether a call sent to ``rollout``'s own path should be refused: the rollout has
        ended, so the call would be on no trajectory. The first refused is logged."""
        with self._lock:
            if rollout not in self._ended:
                return False
            self.late += 1
            first = not self._ended[rollout]
            self._ended[rollout] = True
        if first:
            log.warning("a call to rollout %s's URL (/r/%s/v1) came after the rollout had ended: refused, as "
                        "are later ones (counted, not logged)", rollout, rollout)
        return True

    def take(self, rollout: str) -> list[LLMCall]:
        """The calls of ``rollout``, in the order they arrived; the rollout counts as ended."""
        with self._lock:
            calls = self._calls.pop(rollout, [])
            self._ended.setdefault(rollout, False)
            while len(self._ended) > MAX_ENDED:
                self._ended.popitem(last=False)
        return calls


def rollout_of(headers: Any) -> tuple[Optional[str], Optional[int], str]:
    """(the rollout a request names, the client's number for the call, how it was named:
    "header", "url" or "none")."""
    rollout = headers.get(ROLLOUT_HEADER) or None
    if rollout is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", rollout):
        rollout = None
    number = headers.get(CALL_HEADER)
    call = int(number) if number and number.isdigit() and len(number) < 10 else None
    via = headers.get(VIA_HEADER) or ("header" if rollout else "none")
    return rollout, call, via


def served_call(*, model: str, messages: list[dict[str, Any]], tools: Any, params: dict[str, Any],
                prompt: list[int], outs: list[Any], texts: list[tuple[Optional[str], Any]], stream: bool,
                latency: float, call: Optional[int], via: str, provider: str = "endpoint") -> LLMCall:
    """The record of one answered call: the request as the server read it, the exact prompt
    and sampled tokens, and each choice's message as it was sent back."""
    from artsdk.capture.record import served_step

    choices = []
    for i, (c, (content, tool_calls)) in enumerate(zip(outs, texts)):
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choices.append(Choice(index=i, message=message, token_ids=list(c.token_ids), logprobs=list(c.logprobs),
                              finish_reason="tool_calls" if tool_calls else (c.finish_reason or "stop")))
    done = sum(len(c.token_ids) for c in outs)
    record = LLMCall(provider=provider, model=model, messages=messages, tools=tools, params=params, choices=choices,
                     served_by=model, step=served_step(model), prompt_token_ids=list(prompt), latency=latency,
                     stream=stream, usage={"prompt_tokens": len(prompt), "completion_tokens": done,
                                           "total_tokens": len(prompt) + done})
    record.call = call  # type: ignore[attr-defined] - the client's number for it (extra, not stored)
    record.via = via  # type: ignore[attr-defined]
    record.at = time.time()  # type: ignore[attr-defined] - when it was answered (records of replicas merge by it)
    return record


class PerRolloutPaths:
    """ASGI middleware: ``/r/<rollout id>/v1/...`` is ``/v1/...`` for that rollout (the base
    URL ``art.rollout_env()`` gives a child process or an unpatched client). With the server's
    ``record``, a call sent so to a rollout that has ended is refused with 410 (a router in
    front of replicas passes it on, named by header, and the replica refuses it)."""

    def __init__(self, app: Callable[..., Awaitable[None]], record: Optional[EndpointRecord] = None) -> None:
        self.app, self.record = app, record

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            m = _PATH.match(scope.get("path", ""))
            if m is not None:
                rollout, rest = m.groups()
                headers = [(k, v) for k, v in scope.get("headers", [])
                           if k.lower() not in (ROLLOUT_HEADER.encode(), VIA_HEADER.encode())]
                headers += [(ROLLOUT_HEADER.encode(), rollout.encode()), (VIA_HEADER.encode(), b"url")]
                scope = {**scope, "path": rest, "raw_path": rest.encode(), "headers": headers}
            if self.record is not None:
                found = dict(scope.get("headers") or ())
                rollout = found.get(ROLLOUT_HEADER.encode(), b"").decode("latin-1")
                if found.get(VIA_HEADER.encode()) == b"url" and rollout and self.record.refuse_late(rollout):
                    await error(410, f"rollout {rollout} has ended: a call to its URL now would be on no "
                                     f"trajectory, so it is refused. Make the call inside the rollout (await it "
                                     f"before the rollout returns), or call the session's own URL for work that "
                                     f"is not to be trained", kind="rollout_ended",
                                path=scope["path"])(scope, receive, send)
                    return
        await self.app(scope, receive, send)
