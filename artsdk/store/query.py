"""Reading the store: the SELECT for a set of filters, and rows back to trajectories."""

from __future__ import annotations

from typing import Optional, Sequence

import sqlalchemy as sa

from ..errors import StoreError
from ..trajectory import Trajectory
from . import tables as T
from .rows import Table, build_trajectories


def select_trajectories(
    *, project: Optional[str] = None, model: Optional[str] = None,
    step: Optional[int] = None, rollout: Optional[str] = None,
    group_id: Optional[str] = None, ids: Optional[Sequence[str]] = None,
    min_reward: Optional[float] = None, max_reward: Optional[float] = None,
    error: Optional[bool] = None,
) -> sa.Select:
    """The trajectory rows matching every given filter."""
    t = T.TrajectoryRow.__table__
    q = sa.select(t)
    for col, value in (("project", project), ("model", model), ("step", step),
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


def load(engine: sa.engine.Engine, q: sa.Select, where: str) -> list[Trajectory]:
    """The trajectories a trajectory-row SELECT finds, with their calls, choices and rewards."""
    try:
        with engine.connect() as conn:
            rows = fetch(engine, conn, q)
            if not rows[1]:
                return []
            wanted = sa.select(q.subquery().c.id)
            children = []
            for table in T.TRAJECTORY_CHILDREN:
                tt = table.__table__
                children.append(fetch(engine, conn, sa.select(tt).where(tt.c.trajectory_id.in_(wanted))))
    except sa.exc.DatabaseError as e:
        raise StoreError(f"cannot read store {where}: {e.orig}") from None
    return build_trajectories(rows, children[0], children[1], children[2])


def fetch(engine: sa.engine.Engine, conn: sa.Connection, q: sa.Select) -> Table:
    """(column name -> index, rows as tuples)."""
    if engine.dialect.name != "sqlite":
        result = conn.execute(q)
        return {k: i for i, k in enumerate(result.keys())}, result.all()
    # sqlite3's own cursor: SQLAlchemy result rows cost several times more per row,
    # and a read of thousands of trajectories is mostly rows
    compiled = q.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    args = [params[name] for name in (compiled.positiontup or ())]
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(str(compiled), args)
        cols = {d[0]: i for i, d in enumerate(cursor.description)}
        return cols, cursor.fetchall()
    finally:
        cursor.close()
