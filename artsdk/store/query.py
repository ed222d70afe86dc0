"""Reading the store: the SELECT for a set of filters; trajectories, groups, steps and
checkpoints back from their rows."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import sqlalchemy as sa

from ..errors import StoreError
from ..trajectory.records import Group, Trajectory
from . import tables as T
from .rows import Table, build_trajectories, loads


def select_trajectories(
    *, project: Optional[str] = None, model: Optional[str] = None, run: Optional[str] = None,
    step: Optional[int] = None, rollout: Optional[str] = None,
    group_id: Optional[str] = None, ids: Optional[Sequence[str]] = None,
    min_reward: Optional[float] = None, max_reward: Optional[float] = None,
    error: Optional[bool] = None,
) -> sa.Select:
    """The trajectory rows matching every given filter."""
    t = T.TrajectoryRow.__table__
    q = sa.select(t)
    for col, value in (("project", project), ("model", model), ("run", run), ("step", step),
                       ("rollout", rollout), ("group_id", group_id)):
        if value is not None:
            q = q.where(t.c[col] == value)
    if ids is not None:
        q = q.where(t.c.id.in_(list(ids)))
    if min_reward is not None:
        q = q.where(t.c.reward >= min_reward)
    if max_reward is not None:
        q = q.where(t.c.reward <= max_reward)
    if error is True:
        q = q.where(t.c.error_type.is_not(None))
    elif error is False:
        q = q.where(t.c.error_type.is_(None))
    return q


# up to this many trajectories, their calls, choices and rewards are looked up by their ids
# (a page of the viewer, one group); more, by the trajectory SELECT again as a subquery
_BY_IDS = 500


def load(engine: sa.engine.Engine, q: sa.Select, where: str, every: bool = False) -> list[Trajectory]:
    """The trajectories a trajectory-row SELECT finds, with their calls, choices and rewards.
    ``every``: the SELECT finds every trajectory, so the other tables are read whole (scanned:
    twice as fast as looking each row up by an IN (subquery))."""
    try:
        with engine.connect() as conn:
            rows = fetch(engine, conn, q)
            if not rows[1]:
                return []
            children = [_children(engine, conn, table.__table__, q, rows, every) for table in T.TRAJECTORY_CHILDREN]
    except sa.exc.DatabaseError as e:
        raise StoreError(f"cannot read store {where}: {e.orig}") from None
    return build_trajectories(rows, children[0], children[1], children[2])


def _children(engine: sa.engine.Engine, conn: sa.Connection, tt: sa.Table, q: sa.Select, rows: Table,
              every: bool) -> Table:
    """The rows of ``tt`` (calls, choices or rewards) of the trajectories in ``rows``."""
    if every:
        return fetch(engine, conn, sa.select(tt))
    if len(rows[1]) > _BY_IDS:
        return fetch(engine, conn, sa.select(tt).where(tt.c.trajectory_id.in_(sa.select(q.subquery().c.id))))
    ids = [r[rows[0]["id"]] for r in rows[1]]
    if engine.dialect.name != "sqlite":
        return fetch(engine, conn, sa.select(tt).where(tt.c.trajectory_id.in_(ids)))
    # the SQL as text: compiling a SELECT costs more than running it on a page of trajectories
    return _run(conn, f"SELECT * FROM {tt.name} WHERE trajectory_id IN ({', '.join('?' * len(ids))})", ids)


def fetch(engine: sa.engine.Engine, conn: sa.Connection, q: sa.Select) -> Table:
    """(column name -> index, rows as tuples)."""
    if engine.dialect.name != "sqlite":
        result = conn.execute(q)
        return {k: i for i, k in enumerate(result.keys())}, result.all()
    # sqlite3's own cursor: SQLAlchemy result rows cost several times more per row,
    # and a read of thousands of trajectories is mostly rows
    compiled = q.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    return _run(conn, str(compiled), [params[name] for name in (compiled.positiontup or ())])


def _run(conn: sa.Connection, sql: str, args: list[Any]) -> Table:
    """An SQLite SELECT on sqlite3's own cursor."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, args)
        cols = {d[0]: i for i, d in enumerate(cursor.description)}
        return cols, cursor.fetchall()
    finally:
        cursor.close()


def load_groups(engine: sa.engine.Engine, where: str, *, project: Optional[str] = None,
                model: Optional[str] = None, run: Optional[str] = None, step: Optional[int] = None,
                ids: Optional[Sequence[str]] = None) -> list[Group]:
    """Stored groups with their trajectories (in group order; of a retried rollout, its
    last attempt)."""
    g = T.GroupRow.__table__
    q = sa.select(g)
    for col, value in (("project", project), ("model", model), ("run", run), ("step", step)):
        if value is not None:
            q = q.where(g.c[col] == value)
    if ids is not None:
        q = q.where(g.c.id.in_(list(ids)))
    with engine.connect() as conn:
        group_rows = conn.execute(q.order_by(g.c.created_at, g.c.id)).all()
    if not group_rows:
        return []
    t = T.TrajectoryRow.__table__
    members: dict[str, list[Trajectory]] = {}
    for traj in load(engine, sa.select(t).where(t.c.group_id.in_(sa.select(q.subquery().c.id))), where):
        members.setdefault(traj.group_id or "", []).append(traj)
    out = []
    for row in group_rows:
        trajs = sorted(members.get(row.id, []), key=lambda x: (x.group_index or 0, x.attempt))
        last: dict[int, Trajectory] = {}
        for x in trajs:
            last[x.group_index or 0] = x
        out.append(Group(id=row.id, rollout=row.rollout, scenario=loads(row.scenario),
                         trajectories=list(last.values())))
    return out


def load_steps(engine: sa.engine.Engine, project: str, model: str, run: Optional[str]) -> list[dict[str, Any]]:
    """A run's recorded training steps (of the model's newest run when ``run`` is None), oldest
    first. Step 0, the base model, is none: its row holds only what was measured of it (an
    evaluation, a batch that trained nothing), which the viewer reads."""
    s = T.StepRow.__table__
    run = latest_run(engine, project, model) if run is None else run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(s).where(s.c.project == project, s.c.model == model, s.c.run == (run or ""),
                                               s.c.step > 0).order_by(s.c.step)).all()
    return [{"step": r.step, "run": r.run, "metrics": loads(r.metrics), "created_at": r.created_at} for r in rows]


def load_checkpoints(engine: sa.engine.Engine, project: str, model: str,
                     run: Optional[str]) -> list[dict[str, Any]]:
    """A run's recorded checkpoints (of the model's newest run when ``run`` is None), oldest step first."""
    c = T.CheckpointRow.__table__
    run = latest_run(engine, project, model) if run is None else run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c).where(c.c.project == project, c.c.model == model, c.c.run == (run or ""))
                            .order_by(c.c.step)).all()
    return [{"step": r.step, "run": r.run, "path": r.path, "metrics": loads(r.metrics)} for r in rows]


def load_runs(engine: sa.engine.Engine, project: Optional[str], model: Optional[str]) -> list[dict[str, Any]]:
    """Runs, newest first, with their steps and trajectories counted."""
    r, s, t = T.RunRow.__table__, T.StepRow.__table__, T.TrajectoryRow.__table__
    q = sa.select(r).order_by(r.c.started_at.desc())
    if project is not None:
        q = q.where(r.c.project == project)
    if model is not None:
        q = q.where(r.c.model == model)
    out = []
    with engine.connect() as conn:
        for row in conn.execute(q).all():
            steps = conn.execute(sa.select(sa.func.max(s.c.step)).where(
                s.c.project == row.project, s.c.model == row.model, s.c.run == row.run)).scalar()
            n = conn.execute(sa.select(sa.func.count()).select_from(t).where(
                t.c.project == row.project, t.c.model == row.model, t.c.run == row.run)).scalar()
            out.append({"project": row.project, "model": row.model, "run": row.run, "base_model": row.base_model,
                        "started_at": row.started_at, "meta": loads(row.meta), "last_step": steps,
                        "trajectories": int(n or 0)})
    return out


def latest_run(engine: sa.engine.Engine, project: str, model: str) -> Optional[str]:
    """The model's newest run ("" for a store written before runs, None when it has none)."""
    r = T.RunRow.__table__
    with engine.connect() as conn:
        row = conn.execute(sa.select(r.c.run).where(r.c.project == project, r.c.model == model)
                           .order_by(r.c.started_at.desc()).limit(1)).first()
    return row[0] if row is not None else ("" if _has_steps(engine, project, model) else None)


def _has_steps(engine: sa.engine.Engine, project: str, model: str) -> bool:
    s = T.StepRow.__table__
    with engine.connect() as conn:
        return conn.execute(sa.select(s.c.step).where(s.c.project == project, s.c.model == model).limit(1)) \
            .first() is not None
