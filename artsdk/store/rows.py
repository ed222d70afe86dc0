"""Trajectories to table rows and back."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, Optional, Sequence

from pydantic_core import from_json, to_json

from ..trajectory.records import Choice, ErrorInfo, Group, LLMCall, Trajectory
from . import tables as T


def dumps(value: Any) -> str:
    # fallback=repr: an outcome or scenario that is not JSON (a custom object) is kept as
    # its repr rather than refusing to store the trajectory
    return to_json(value, fallback=repr).decode()


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
    # defaults: every field is given here (the round-trip tests hold both to the same result)
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", set(fields))
    object.__setattr__(obj, "__pydantic_extra__", extra)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


_CHOICE = frozenset(Choice.model_fields)
_CALL = frozenset(LLMCall.model_fields)
_TRAJ = frozenset(Trajectory.model_fields)


def _build(rows: Table, calls: Table, choices: Table, rewards: Table) -> list[Trajectory]:
    k = choices[0]
    by_call: dict[tuple[str, int], list[Choice]] = {}
    for ch in choices[1]:
        by_call.setdefault((ch[k["trajectory_id"]], ch[k["call_idx"]]), []).append(_make(Choice, _CHOICE, {}, {
            "index": ch[k["idx"]], "message": loads(ch[k["message"]]),
            "finish_reason": ch[k["finish_reason"]], "token_ids": loads(ch[k["token_ids"]]),
            "logprobs": loads(ch[k["logprobs"]]),
        }))
    k = calls[0]
    calls_of: dict[str, list[Any]] = {}
    for c in calls[1]:
        calls_of.setdefault(c[k["trajectory_id"]], []).append(c)
    rewards_of: dict[str, dict[str, float]] = {}
    kr = rewards[0]
    for r in rewards[1]:
        rewards_of.setdefault(r[kr["trajectory_id"]], {})[r[kr["name"]]] = r[kr["value"]]
    kt = rows[0]
    out = []
    for r in rows[1]:
        tid = r[kt["id"]]
        built: list[LLMCall] = []
        for c in sorted(calls_of.get(tid, ()), key=lambda c: c[k["idx"]]):
            messages = loads(c[k["messages"]])
            if c[k["prefix"]] and built:
                prev = built[-1]
                convo = prev.messages if not prev.choices else [*prev.messages, prev.choices[0].message]
                messages = convo[: c[k["prefix"]]] + messages
            idx = c[k["idx"]]
            built.append(_make(LLMCall, _CALL, {}, {
                "index": idx, "provider": c[k["provider"]], "model": c[k["model"]],
                "messages": messages, "tools": loads(c[k["tools"]]), "params": loads(c[k["params"]]),
                "choices": sorted(by_call.get((tid, idx), ()), key=lambda x: x.index),
                "served_by": c[k["served_by"]], "step": c[k["step"]], "usage": loads(c[k["usage"]]),
                "prompt_token_ids": loads(c[k["prompt_token_ids"]]), "latency": c[k["latency"]],
                "stream": bool(c[k["stream"]]), "incomplete": bool(c[k["incomplete"]]),
                "error": c[k["error"]],
            }))
        error = None
        if r[kt["error_type"]] is not None:
            error = ErrorInfo.model_construct(type=r[kt["error_type"]], message=r[kt["error_message"]] or "",
                                              traceback=r[kt["traceback"]] or "")
        out.append(_make(Trajectory, _TRAJ, None, {
            "id": tid, "rollout": r[kt["rollout"]], "project": r[kt["project"]],
            "model": r[kt["model"]], "run": r[kt["run"]], "step": r[kt["step"]], "group_id": r[kt["group_id"]],
            "group_index": r[kt["group_index"]], "attempt": r[kt["attempt"]],
            "scenario": loads(r[kt["scenario"]]), "outcome": loads(r[kt["outcome"]]),
            "calls": built, "rewards": rewards_of.get(tid, {}), "reward": r[kt["reward"]],
            "error": error, "warnings": loads(r[kt["warnings"]]), "metadata": loads(r[kt["meta"]]),
            "started_at": _dt(r[kt["started_at"]]), "ended_at": _dt(r[kt["ended_at"]]),
            "duration": r[kt["duration"]],
        }))
    return out
