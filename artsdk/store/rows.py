"""Trajectories to table rows and back."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from datetime import datetime, timezone
from operator import attrgetter, itemgetter
from typing import Any, Iterator, Optional, Sequence

from pydantic import BaseModel
from pydantic_core import from_json, to_json

from ..trajectory.records import Choice, ErrorInfo, Group, LLMCall, Trajectory
from . import tables as T


def dumps(value: Any) -> str:
    # nothing, or an empty dict or list (most warnings, metadata and scenarios): known text,
    # at a third of the serializer's cost
    if value is None:
        return "null"
    if not value and type(value) in _EMPTY:
        return _EMPTY[type(value)]
    # fallback=repr: an outcome or scenario that is not JSON (a custom object) is kept as
    # its repr rather than refusing to store the trajectory
    return to_json(value, fallback=repr).decode()


_EMPTY = {dict: "{}", list: "[]"}

JSON_COLUMNS = frozenset({"scenario", "outcome", "warnings", "meta", "messages", "tools", "params", "usage",
                          "prompt_token_ids", "message", "token_ids", "logprobs", "metrics", "config"})
"""The columns that hold JSON text (written by ``dumps``)."""


def loads(text: Optional[str]) -> Any:
    return None if text is None else from_json(text)


def _ts(dt: Optional[datetime]) -> Optional[float]:
    return None if dt is None else dt.timestamp()


def _dt(ts: Optional[float]) -> Optional[datetime]:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc)


def _shared_prefix(prev: Optional[LLMCall], messages: list[dict[str, Any]]) -> int:
    """How many leading messages of ``messages`` are the previous call's conversation."""
    if prev is None or not prev.messages:
        return 0
    convo = prev.messages if prev.message is None else [*prev.messages, prev.message]
    n = len(convo)
    if len(messages) >= n and messages[:n] == convo:
        return n
    n = len(prev.messages)
    if len(messages) >= n and messages[:n] == prev.messages:
        return n
    return 0


TRAJECTORY_COLUMNS = ("id", "project", "model", "run", "step", "group_id", "group_index", "rollout", "attempt",
                      "scenario", "outcome", "reward", "error_type", "error_message", "traceback", "warnings", "meta",
                      "started_at", "ended_at", "duration", "n_calls")
CALL_COLUMNS = ("trajectory_id", "idx", "provider", "model", "served_by", "step", "prefix", "messages", "tools",
                "params", "usage", "prompt_token_ids", "latency", "stream", "incomplete", "error")
CHOICE_COLUMNS = ("trajectory_id", "call_idx", "idx", "message", "finish_reason", "token_ids", "logprobs")
REWARD_COLUMNS = ("trajectory_id", "name", "value")
GROUP_COLUMNS = ("id", "project", "model", "run", "step", "rollout", "scenario", "size", "reward_mean", "reward_std",
                 "no_signal", "created_at")
"""The columns each row tuple below holds, in its order (an INSERT names them)."""

Row = tuple[Any, ...]


def trajectory_rows(t: Trajectory) -> tuple[Row, list[Row], list[Row], list[Row]]:
    """(trajectory row, call rows, choice rows, reward rows) for one trajectory, as tuples
    of the ``*_COLUMNS`` above."""
    err = t.error
    tid = t.id
    row = (
        tid, t.project, t.model, t.run, t.step, t.group_id, t.group_index, t.rollout, t.attempt,
        dumps(t.scenario), dumps(t.outcome), t.reward,
        err.type if err else None, err.message if err else None, err.traceback if err else None,
        dumps(t.warnings), dumps(t.metadata), t.started_at.timestamp(), _ts(t.ended_at), t.duration, len(t.calls),
    )
    calls, choices = [], []
    prev: Optional[LLMCall] = None
    for c in t.calls:
        prefix = _shared_prefix(prev, c.messages)
        calls.append((
            tid, c.index, c.provider, c.model, c.served_by, c.step, prefix, dumps(c.messages[prefix:]),
            None if c.tools is None else dumps(c.tools), dumps(c.params),
            None if c.usage is None else dumps(c.usage),
            None if c.prompt_token_ids is None else dumps(c.prompt_token_ids),
            c.latency, c.stream, c.incomplete, c.error,
        ))
        for ch in c.choices:
            choices.append((
                tid, c.index, ch.index, dumps(ch.message), ch.finish_reason,
                None if ch.token_ids is None else dumps(ch.token_ids),
                None if ch.logprobs is None else dumps(ch.logprobs),
            ))
        prev = c
    rewards = [(tid, k, v) for k, v in t.rewards.items()]
    return row, calls, choices, rewards


class Rows:
    """What one submission writes: row tuples per table, in the order foreign keys need."""

    ORDER = (T.TrajectoryRow, T.CallRow, T.ChoiceRow, T.RewardRow)
    COLUMNS = {T.GroupRow: GROUP_COLUMNS, T.TrajectoryRow: TRAJECTORY_COLUMNS, T.CallRow: CALL_COLUMNS,
               T.ChoiceRow: CHOICE_COLUMNS, T.RewardRow: REWARD_COLUMNS}
    __slots__ = ("tables", "groups", "projects", "replace")

    def __init__(self, groups: list[Row], projects: set[str], replace: bool) -> None:
        self.tables: dict[Any, list[Row]] = {t: [] for t in self.ORDER}
        self.groups = groups
        self.projects = projects
        self.replace = replace

    def ids(self) -> tuple[list[str], list[str]]:
        """The ids of the trajectories and of the groups (each row's first column)."""
        return [r[0] for r in self.tables[T.TrajectoryRow]], [g[0] for g in self.groups]


def group_row(g: Group, project: Optional[str], model: Optional[str], run: Optional[str], step: Optional[int],
              created_at: float) -> Row:
    scored = g.scored
    return (g.id, project, model, run, step, g.rollout, dumps(g.scenario), len(g),
            g.mean if scored else None, g.std if scored else None, g.no_signal, created_at)


Table = tuple[dict[str, int], Sequence[Sequence[Any]]]
"""Rows as read: (column name -> index, rows as tuples)."""


def build_trajectories(rows: Table, calls: Table, choices: Table, rewards: Table) -> list[Trajectory]:
    """Trajectories from the rows of the four tables (rows in any order). The data was
    validated on its way in, so objects are built without validating again, and the
    cyclic garbage collector is paused meanwhile: it would otherwise rescan the growing
    heap of new (acyclic) objects again and again. Both together make reading several
    times faster."""
    with gc_paused():
        return _build(rows, calls, choices, rewards)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while many acyclic objects are made at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _make(cls: Any, fields: frozenset[str], extra: Any, values: dict[str, Any]) -> Any:
    # what BaseModel.model_construct ends up doing, without its per-field loop over
    # defaults: every field is given here (the round-trip tests hold both to the same result);
    # the slots are set through their descriptors, a quarter faster than object.__setattr__
    obj = object.__new__(cls)
    _set_attr(obj, "__dict__", values)
    _set_fields_set(obj, set(fields))
    _set_extra(obj, extra)
    _set_private(obj, None)
    return obj


_set_attr = object.__setattr__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


_CHOICE = frozenset(Choice.model_fields)
_CALL = frozenset(LLMCall.model_fields)
_TRAJ = frozenset(Trajectory.model_fields)


def _columns(table: Table, *names: str) -> Iterator[tuple[Any, ...]]:
    """``table``'s rows as tuples of the named columns, in that order."""
    return map(itemgetter(*(table[0][n] for n in names)), table[1])


def _build(rows: Table, calls: Table, choices: Table, rewards: Table) -> list[Trajectory]:
    by_call: dict[tuple[str, int], list[Choice]] = {}
    for tid, call_idx, idx, message, finish, token_ids, logprobs in _columns(
            choices, "trajectory_id", "call_idx", "idx", "message", "finish_reason", "token_ids", "logprobs"):
        by_call.setdefault((tid, call_idx), []).append(_make(Choice, _CHOICE, {}, {
            "index": idx, "message": loads(message), "finish_reason": finish, "token_ids": loads(token_ids),
            "logprobs": loads(logprobs),
        }))
    calls_of: dict[str, list[tuple[Any, ...]]] = {}
    for c in _columns(calls, "trajectory_id", "idx", "prefix", "messages", "provider", "model", "tools", "params",
                      "served_by", "step", "usage", "prompt_token_ids", "latency", "stream", "incomplete", "error"):
        calls_of.setdefault(c[0], []).append(c)
    rewards_of: dict[str, dict[str, float]] = {}
    for tid, name, value in _columns(rewards, "trajectory_id", "name", "value"):
        rewards_of.setdefault(tid, {})[name] = value
    out = []
    for (tid, rollout, project, model, run, step, group_id, group_index, attempt, scenario, outcome, reward,
         error_type, error_message, traceback, warnings, meta, started_at, ended_at, duration) in _columns(
            rows, "id", "rollout", "project", "model", "run", "step", "group_id", "group_index", "attempt",
            "scenario", "outcome", "reward", "error_type", "error_message", "traceback", "warnings", "meta",
            "started_at", "ended_at", "duration"):
        built: list[LLMCall] = []
        of = calls_of.get(tid, ())
        for (_, idx, prefix, messages, provider, call_model, tools, params, served_by, call_step, usage, prompt_ids,
             latency, stream, incomplete, call_error) in (sorted(of, key=_by_index) if len(of) > 1 else of):
            messages = loads(messages)
            if prefix and built:
                prev = built[-1]
                convo = prev.messages if not prev.choices else [*prev.messages, prev.choices[0].message]
                messages = convo[:prefix] + messages
            picked = by_call.get((tid, idx), [])
            built.append(_make(LLMCall, _CALL, {}, {
                "index": idx, "provider": provider, "model": call_model,
                "messages": messages, "tools": loads(tools), "params": loads(params),
                "choices": sorted(picked, key=_by_choice_index) if len(picked) > 1 else picked,
                "served_by": served_by, "step": call_step, "usage": loads(usage),
                "prompt_token_ids": loads(prompt_ids), "latency": latency,
                "stream": bool(stream), "incomplete": bool(incomplete), "error": call_error,
            }))
        error = None
        if error_type is not None:
            error = ErrorInfo.model_construct(type=error_type, message=error_message or "", traceback=traceback or "")
        out.append(_make(Trajectory, _TRAJ, None, {
            "id": tid, "rollout": rollout, "project": project, "model": model, "run": run, "step": step,
            "group_id": group_id, "group_index": group_index, "attempt": attempt,
            "scenario": loads(scenario), "outcome": loads(outcome),
            "calls": built, "rewards": rewards_of.get(tid, {}), "reward": reward,
            "error": error, "warnings": loads(warnings), "metadata": loads(meta),
            "started_at": _dt(started_at), "ended_at": _dt(ended_at), "duration": duration,
        }))
    return out


_by_index = itemgetter(1)  # a call's idx, in the tuples _build reads
_by_choice_index = attrgetter("index")
