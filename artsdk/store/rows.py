"""Trajectories to table rows and back."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Optional

from pydantic_core import from_json, to_json

from ..trajectory import Group, LLMCall, Trajectory


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
        "id": t.id, "project": t.project, "model": t.model, "step": t.step,
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


def group_row(g: Group, project: Optional[str], model: Optional[str], step: Optional[int],
              created_at: float) -> dict[str, Any]:
    scored = g.scored
    return {
        "id": g.id, "project": project, "model": model, "step": step, "rollout": g.rollout,
        "scenario": dumps(g.scenario), "size": len(g),
        "reward_mean": g.mean if scored else None, "reward_std": g.std if scored else None,
        "no_signal": g.no_signal, "created_at": created_at,
    }


def build_trajectories(
    rows: Iterable[Any], calls: Iterable[Any], choices: Iterable[Any], rewards: Iterable[Any]
) -> list[Trajectory]:
    """Trajectories from the rows of the four tables (rows in any order)."""
    by_call: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for ch in choices:
        by_call.setdefault((ch.trajectory_id, ch.call_idx), []).append({
            "index": ch.idx, "message": loads(ch.message), "finish_reason": ch.finish_reason,
            "token_ids": loads(ch.token_ids), "logprobs": loads(ch.logprobs),
        })
    calls_of: dict[str, list[Any]] = {}
    for c in calls:
        calls_of.setdefault(c.trajectory_id, []).append(c)
    rewards_of: dict[str, dict[str, float]] = {}
    for r in rewards:
        rewards_of.setdefault(r.trajectory_id, {})[r.name] = r.value
    out = []
    for r in rows:
        built: list[dict[str, Any]] = []
        for c in sorted(calls_of.get(r.id, ()), key=lambda c: c.idx):
            inherited: list[dict[str, Any]] = []
            if c.prefix and built:
                prev = built[-1]
                convo = [*prev["messages"], *([prev["choices"][0]["message"]] if prev["choices"] else [])]
                inherited = convo[: c.prefix]
            built.append({
                "index": c.idx, "provider": c.provider, "model": c.model,
                "messages": inherited + loads(c.messages), "tools": loads(c.tools),
                "params": loads(c.params),
                "choices": sorted(by_call.get((r.id, c.idx), ()), key=lambda x: x["index"]),
                "served_by": c.served_by, "step": c.step, "usage": loads(c.usage),
                "prompt_token_ids": loads(c.prompt_token_ids), "latency": c.latency,
                "stream": bool(c.stream), "incomplete": bool(c.incomplete), "error": c.error,
            })
        error = None
        if r.error_type is not None:
            error = {"type": r.error_type, "message": r.error_message or "",
                     "traceback": r.traceback or ""}
        out.append(Trajectory.model_validate({
            "id": r.id, "rollout": r.rollout, "project": r.project, "model": r.model,
            "step": r.step, "group_id": r.group_id, "group_index": r.group_index,
            "attempt": r.attempt, "scenario": loads(r.scenario), "outcome": loads(r.outcome),
            "calls": built, "rewards": rewards_of.get(r.id, {}), "reward": r.reward,
            "error": error, "warnings": loads(r.warnings), "metadata": loads(r.meta),
            "started_at": _dt(r.started_at), "ended_at": _dt(r.ended_at), "duration": r.duration,
        }))
    return out
