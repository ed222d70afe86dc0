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


def trajectory_rows(t: Trajectory) -> tuple[dict[str, Any], list[dict], list[dict], list[dict]]:
    """(trajectory row, call rows, choice rows, reward rows) for one trajectory."""
    err = t.error
    row = {
        "id": t.id, "project": t.project, "model": t.model, "run": t.run, "step": t.step,
        "group_id": t.group_id, "group_index": t.group_index, "rollout": t.rollout,
        "attempt": t.attempt, "scenario": dumps(t.scenario), "outcome": dumps(t.outcome),
        "reward": t.reward,
        "error_type": err.type if err else None, "error_message": err.message if err else None,
        "traceback": err.traceback if err else None,
        "warnings": dumps(t.warnings), "meta": dumps(t.metadata),
        "started_at": t.started_at.timestamp(), "ended_at": _ts(t.ended_at),
        "duration": t.duration, "n_calls": len(t.calls),
    }
    calls, choices = [], []
    prev: Optional[LLMCall] = None
    for c in t.calls:
        prefix = _shared_prefix(prev, c.messages)
        calls.append({
            "trajectory_id": t.id, "idx": c.index, "provider": c.provider, "model": c.model,
            "served_by": c.served_by, "step": c.step, "prefix": prefix,
            "messages": dumps(c.messages[prefix:]),
            "tools": None if c.tools is None else dumps(c.tools), "params": dumps(c.params),
            "usage": None if c.usage is None else dumps(c.usage),
            "prompt_token_ids": None if c.prompt_token_ids is None else dumps(c.prompt_token_ids),
            "latency": c.latency, "stream": c.stream, "incomplete": c.incomplete, "error": c.error,
        })
        for ch in c.choices:
            choices.append({
                "trajectory_id": t.id, "call_idx": c.index, "idx": ch.index,
                "message": dumps(ch.message), "finish_reason": ch.finish_reason,
                "token_ids": None if ch.token_ids is None else dumps(ch.token_ids),
                "logprobs": None if ch.logprobs is None else dumps(ch.logprobs),
            })
        prev = c
    rewards = [{"trajectory_id": t.id, "name": k, "value": v} for k, v in t.rewards.items()]
    return row, calls, choices, rewards


class Rows:
    """What one submission writes: rows per table, in the order foreign keys need."""

    ORDER = (T.TrajectoryRow, T.CallRow, T.ChoiceRow, T.RewardRow)
    __slots__ = ("tables", "groups", "projects", "replace")

    def __init__(self, groups: list[dict[str, Any]], projects: set[str], replace: bool) -> None:
        self.tables: dict[Any, list[dict[str, Any]]] = {t: [] for t in self.ORDER}
        self.groups = groups
        self.projects = projects
        self.replace = replace


def group_row(g: Group, project: Optional[str], model: Optional[str], run: Optional[str], step: Optional[int],
              created_at: float) -> dict[str, Any]:
    scored = g.scored
    return {
        "id": g.id, "project": project, "model": model, "run": run, "step": step, "rollout": g.rollout,
        "scenario": dumps(g.scenario), "size": len(g),
        "reward_mean": g.mean if scored else None, "reward_std": g.std if scored else None,
        "no_signal": g.no_signal, "created_at": created_at,
    }


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
