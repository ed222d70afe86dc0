"""The recording that answers a re-run's LLM calls (``art.replay.rerun``): each call the
agent makes is checked against the recorded request and answered with the recorded answer,
in order, with no model or network."""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from typing import Any, Optional

from ..errors import ReplayError
from ..trajectory.records import LLMCall


class Cassette:
    """The recorded calls of one trajectory, answered in order during ``replay.rerun``."""

    def __init__(self, calls: list[LLMCall], trajectory_id: str) -> None:
        self.calls = calls
        self.trajectory_id = trajectory_id
        self.position = 0
        self._lock = threading.Lock()

    def next_call(self, model: str, messages: list[dict[str, Any]], tools: Any) -> LLMCall:
        with self._lock:
            i = self.position
            self.position += 1
        if i >= len(self.calls):
            raise ReplayError(
                f"call {i} of the re-run has no recording: trajectory {self.trajectory_id} "
                f"made only {len(self.calls)} call(s)"
            )
        recorded = self.calls[i]
        check_same_request(recorded, model, messages, tools, i, self.trajectory_id)
        return recorded


current_cassette: ContextVar[Optional[Cassette]] = ContextVar("artsdk_cassette", default=None)


def _norm(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # compare what the model would see, not incidental keys or None-valued fields
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    out = []
    for m in messages:
        d = {k: m[k] for k in keep if m.get(k) not in (None, [])}
        if "tool_calls" in d:
            d["tool_calls"] = [
                {"name": tc.get("function", {}).get("name"),
                 "arguments": tc.get("function", {}).get("arguments")}
                for tc in d["tool_calls"]
            ]
        out.append(d)
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 120 else text[:117] + "..."


def check_same_request(recorded: LLMCall, model: str, messages: list[dict[str, Any]],
                       tools: Any, index: int, trajectory_id: str) -> None:
    """Raise ReplayError describing the first difference between a recorded request and
    the one the re-run makes."""
    where = f"call {index} of trajectory {trajectory_id[:8]}"
    if model != recorded.model:
        raise ReplayError(f"{where}: model {model!r} differs from the recorded {recorded.model!r}")
    a, b = _norm(recorded.messages), _norm(messages)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key):
                    raise ReplayError(
                        f"{where}: messages[{i}].{key} differs from the recording: recorded "
                        f"{_short(x.get(key))}, got {_short(y.get(key))}"
                    )
    if len(a) != len(b):
        raise ReplayError(f"{where}: the request has {len(b)} messages, the recording {len(a)}")
    if (recorded.tools or None) != (tools or None):
        raise ReplayError(f"{where}: the tools differ from the recording")
