"""What the viewer asks of the store, each one SQL query (or a few) that reads only the
page it shows: aggregates by step for the reward curve, LIMIT/OFFSET pages of groups and
trajectories, one trajectory whole. Nothing loads the store into memory, so a store of
100,000 trajectories answers as fast as a small one."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import sqlalchemy as sa

from ..store import Store
from ..store import tables as T
from ..store.rows import dumps

PAGE = 50
# how an evaluation's trajectories are told apart (run.evaluate marks them): its metadata as stored
EVALUATION = '%"evaluation":%'
_traj = T.TrajectoryRow.__table__
_groups = T.GroupRow.__table__
_steps = T.StepRow.__table__
_models = T.ModelRow.__table__
_rewards = T.RewardRow.__table__
_calls = T.CallRow.__table__


def _in_run(col: Any, run: Optional[str]) -> Any:
    """Rows of ``run`` ("" is the rows written before runs existed, whose run is empty or NULL)."""
    return sa.or_(col.is_(None), col == "") if run == "" else col == run


class Views:
    """The viewer's reads of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store._engine

    def _rows(self, q: sa.Select) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    # -- projects and models --------------------------------------------------------------

    def projects(self) -> list[dict[str, Any]]:
        """Every project, its models and how many trajectories each has (and the
        trajectories of no trainable model, under the model None)."""
        counts = self._rows(sa.select(_traj.c.project, _traj.c.model, sa.func.count().label("trajectories"),
                                      sa.func.max(_traj.c.step).label("last_step"),
                                      sa.func.count(sa.distinct(_traj.c.run)).label("runs"))
                            .group_by(_traj.c.project, _traj.c.model))
        models = {(m["project"], m["name"]): m for m in self._rows(sa.select(_models))}
        out: dict[str, dict[str, Any]] = {}
        for c in counts:
            entry = out.setdefault(c["project"] or "", {"project": c["project"] or "", "models": []})
            info = models.pop((c["project"], c["model"]), None)
            entry["models"].append({"model": c["model"], "trajectories": c["trajectories"], "last_step": c["last_step"],
                                    "runs": c["runs"], "base_model": info["base_model"] if info else None})
        for (project, name), info in models.items():  # registered, nothing gathered yet
            out.setdefault(project, {"project": project, "models": []})["models"].append(
                {"model": name, "trajectories": 0, "last_step": None, "runs": 0, "base_model": info["base_model"]})
        return sorted(out.values(), key=lambda p: p["project"])

    def base_model(self, project: Optional[str], model: Optional[str]) -> Optional[str]:
        rows = self._rows(sa.select(_models.c.base_model).where(_models.c.project == project, _models.c.name == model))
        return rows[0]["base_model"] if rows else None

    # -- the curve ------------------------------------------------------------------------

    def runs(self, project: str, model: str) -> list[dict[str, Any]]:
        """The model's runs, newest first (what the run menu offers)."""
        return [{k: r[k] for k in ("run", "started_at", "last_step", "trajectories")}
                for r in self.store.runs(project=project, model=model)]

    def curve(self, project: str, model: str, run: Optional[str] = None) -> dict[str, Any]:
        """Per step of one run (default: the newest): the training groups' rewards -- count,
        mean, spread, range, failures -- and each named reward part's mean; and the metrics the
        step recorded (its training's, its evaluations' ``eval/...``, a batch that trained
        nothing). Evaluations' trajectories (``metadata["evaluation"]``) are not in the training curve."""
        run = self.store.latest_run(project, model) if run is None else run
        r = _traj.c.reward
        trained = [_traj.c.project == project, _traj.c.model == model, _traj.c.step.is_not(None),
                   sa.not_(_traj.c.meta.like(EVALUATION)), *([] if run is None else [_in_run(_traj.c.run, run)])]
        q = (sa.select(_traj.c.step, sa.func.count().label("n"), sa.func.avg(r).label("mean"),
                       sa.func.avg(r * r).label("mean_sq"), sa.func.min(r).label("min"), sa.func.max(r).label("max"),
                       sa.func.sum(sa.case((_traj.c.error_type.is_not(None), 1), else_=0)).label("errors"))
             .where(*trained).group_by(_traj.c.step).order_by(_traj.c.step))
        parts = self._rows(sa.select(_traj.c.step, _rewards.c.name, sa.func.avg(_rewards.c.value).label("mean"))
                           .select_from(_rewards.join(_traj, _traj.c.id == _rewards.c.trajectory_id))
                           .where(*trained).group_by(_traj.c.step, _rewards.c.name)
                           .order_by(_rewards.c.name, _traj.c.step))
        points = []
        for p in self._rows(q):
            mean = p.pop("mean_sq")
            var = max((mean or 0.0) - (p["mean"] or 0.0) ** 2, 0.0) if p["mean"] is not None else None
            points.append({**p, "std": math.sqrt(var) if var is not None else None})
        metrics = [{"step": s["step"], **json.loads(s["metrics"])}
                   for s in self._rows(sa.select(_steps.c.step, _steps.c.metrics)
                                       .where(_steps.c.project == project, _steps.c.model == model,
                                              _steps.c.run == (run or ""))
                                       .order_by(_steps.c.step))]
        return {"project": project, "model": model, "run": run, "runs": self.runs(project, model),
                "points": points, "parts": parts, "metrics": metrics}

    # -- groups ---------------------------------------------------------------------------

    def groups(self, project: str, model: str, step: int, offset: int = 0, limit: int = PAGE,
               run: Optional[str] = None) -> dict[str, Any]:
        """A page of the groups gathered at ``step`` (of ``run``, default the newest), each with
        its members' rewards, reward parts and failures."""
        run = self.store.latest_run(project, model) if run is None else run
        where = [_groups.c.project == project, _groups.c.model == model, _groups.c.step == step,
                 *([] if run is None else [_in_run(_groups.c.run, run)])]
        total = self._rows(sa.select(sa.func.count().label("n")).select_from(_groups).where(*where))[0]["n"]
        page = self._rows(sa.select(_groups).where(*where).order_by(_groups.c.created_at, _groups.c.id)
                          .offset(offset).limit(limit))
        ids = [g["id"] for g in page]
        members = self._rows(sa.select(_traj.c.id, _traj.c.group_id, _traj.c.group_index, _traj.c.attempt,
                                       _traj.c.reward, _traj.c.error_type, _traj.c.error_message, _traj.c.scenario)
                             .where(_traj.c.group_id.in_(ids)).order_by(_traj.c.group_index, _traj.c.attempt))
        parts = self._parts([m["id"] for m in members])
        incomplete = self._incomplete([m["id"] for m in members])
        by_group: dict[str, list[dict[str, Any]]] = {}
        arguments: dict[str, Any] = {}  # what a member was called with: the key to compare by
        for m in members:
            arguments.setdefault(m["group_id"], json.loads(m.pop("scenario")))
            by_group.setdefault(m["group_id"], []).append(
                {**m, "rewards": parts.get(m["id"], {}), "incomplete": m["id"] in incomplete})
        groups = [{"id": g["id"], "rollout": g["rollout"], "scenario": json.loads(g["scenario"]), "size": g["size"],
                   "arguments": arguments.get(g["id"]), "reward_mean": g["reward_mean"],
                   "reward_std": g["reward_std"], "no_signal": g["no_signal"],
                   "trajectories": by_group.get(g["id"], [])} for g in page]
        return {"total": total, "offset": offset, "limit": limit, "groups": groups}

    def _parts(self, ids: list[str]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        if ids:
            for r in self._rows(sa.select(_rewards).where(_rewards.c.trajectory_id.in_(ids))):
                out.setdefault(r["trajectory_id"], {})[r["name"]] = r["value"]
        return out

    def _incomplete(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        q = sa.select(_calls.c.trajectory_id).where(_calls.c.trajectory_id.in_(ids), _calls.c.incomplete.is_(True))
        return {r["trajectory_id"] for r in self._rows(q)}

    # -- trajectories ---------------------------------------------------------------------

    def trajectories(self, *, project: Optional[str] = None, model: Optional[str] = None, run: Optional[str] = None,
                     rollout: Optional[str] = None, min_step: Optional[int] = None, max_step: Optional[int] = None,
                     min_reward: Optional[float] = None, max_reward: Optional[float] = None,
                     errors: bool = False, offset: int = 0, limit: int = PAGE) -> dict[str, Any]:
        """A page of trajectory summaries matching the filters, newest first."""
        where = []
        for col, value in (("project", project), ("model", model), ("rollout", rollout)):
            if value is not None:
                where.append(_traj.c[col] == value)
        if run is not None:
            where.append(_in_run(_traj.c.run, run))
        if min_step is not None:
            where.append(_traj.c.step >= min_step)
        if max_step is not None:
            where.append(_traj.c.step <= max_step)
        if min_reward is not None:
            where.append(_traj.c.reward >= min_reward)
        if max_reward is not None:
            where.append(_traj.c.reward <= max_reward)
        if errors:
            where.append(_traj.c.error_type.is_not(None))
        total = self._rows(sa.select(sa.func.count().label("n")).select_from(_traj).where(*where))[0]["n"]
        cols = [_traj.c[c] for c in ("id", "project", "model", "run", "step", "rollout", "group_id", "group_index", "attempt",
                                     "reward", "error_type", "error_message", "started_at", "duration", "n_calls",
                                     "scenario")]
        rows = self._rows(sa.select(*cols).where(*where).order_by(_traj.c.started_at.desc())
                          .offset(offset).limit(limit))
        for r in rows:
            r["scenario"] = json.loads(r["scenario"])
        return {"total": total, "offset": offset, "limit": limit, "rows": rows}

    def trajectory(self, trajectory_id: str) -> dict[str, Any]:
        """One trajectory whole: its calls (messages, tool calls, tokens and logprobs), rewards,
        outcome, error and timings."""
        t = self.store.get(trajectory_id)
        return json.loads(t.model_dump_json(fallback=repr))

    def compare(self, project: str, model: str, scenario: str, step_a: int, step_b: int,
                run: Optional[str] = None) -> dict[str, Any]:
        """The trajectories of one scenario (as JSON, however spaced) at two steps of a run
        (default: the newest)."""
        try:
            parsed = json.loads(scenario)
        except ValueError:
            raise ValueError(f"scenario {scenario[:80]!r} is not JSON (give it as the step page links it)") from None
        stored = dumps(parsed)  # the store's spelling of it
        run = self.store.latest_run(project, model) if run is None else run
        q = (sa.select(_traj.c.id, _traj.c.step).where(_traj.c.project == project, _traj.c.model == model,
                                                        _traj.c.scenario == stored,
                                                        _traj.c.step.in_([step_a, step_b]),
                                                        *([] if run is None else [_in_run(_traj.c.run, run)]))
             .order_by(_traj.c.group_index, _traj.c.attempt).limit(4 * PAGE))
        found = self._rows(q)
        out: dict[str, Any] = {"scenario": parsed, "a": [], "b": [], "step_a": step_a, "step_b": step_b}
        for row in found:
            side = "a" if row["step"] == step_a else "b"
            out[side].append(self.trajectory(row["id"]))
        return out

    def scenarios(self, project: str, model: str, step: int, limit: int = PAGE,
                  run: Optional[str] = None) -> list[str]:
        """The scenarios (stored JSON) gathered at ``step`` of a run, for choosing one to compare."""
        run = self.store.latest_run(project, model) if run is None else run
        q = (sa.select(_traj.c.scenario).where(_traj.c.project == project, _traj.c.model == model,
                                                _traj.c.step == step, *([] if run is None else [_in_run(_traj.c.run, run)]))
             .distinct().limit(limit))
        return [r["scenario"] for r in self._rows(q)]
