"""Writing to the store: the rows of a submission (trajectories with their calls, choices
and rewards, and groups), and the writer's commit of several submissions at once -- one
INSERT per table for all of them."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any, Callable, Iterable, Sequence

import sqlalchemy as sa
from pydantic_core import PydanticSerializationError
from sqlmodel import AutoString

from ..errors import StoreError
from ..trajectory.records import Group, Trajectory
from . import tables as T
from .rows import GROUP_COLUMNS, JSON_COLUMNS, Row, Rows, gc_paused, group_row, trajectory_rows
from .storable import ESCAPED, storable, storable_group
from .writer import Job


def submission(trajectories: Iterable[Trajectory], groups: Sequence[Group], replace: bool) -> Job:
    """A writer job holding the rows of ``trajectories`` and ``groups``; if it cannot be
    committed, its ``dump`` keeps the data as JSON. Text that cannot be stored as it is (lone
    surrogates) is escaped, and the trajectory says so in a warning. StoreError for a reward
    that is not a finite number."""
    trajs = list(trajectories)
    for t in trajs:
        _check_rewards(t)
    try:
        batch = _rows(trajs, groups, replace)
    except (UnicodeEncodeError, PydanticSerializationError) as e:
        if isinstance(e, PydanticSerializationError) and "surrogates" not in str(e):
            raise
        for t in trajs:  # the caller's trajectory says what the stored copy holds
            if ESCAPED not in t.warnings:
                t.warnings.append(ESCAPED)
        copies = {t.id: storable(t) for t in trajs}
        trajs = list(copies.values())
        groups = [storable_group(g, [copies.get(m.id) or storable(m) for m in g]) for g in groups]
        batch = _rows(trajs, groups, replace)
    label = f"trajectory {trajs[0].id}" if len(trajs) == 1 else f"{len(trajs)} trajectories"

    def dump() -> str:
        # ASCII JSON: whatever the text held, the file can be written
        return json.dumps({"trajectories": [t.model_dump(mode="json", fallback=repr) for t in trajs],
                           "groups": [dict(zip(GROUP_COLUMNS, g)) for g in batch.groups], "replace": replace},
                          ensure_ascii=True, default=repr)

    return Job(batch, label, dump)


def _rows(trajs: list[Trajectory], groups: Sequence[Group], replace: bool) -> Rows:
    """The rows of a submission, every string checked to be storable (UnicodeEncodeError)."""
    now = time.time()
    batch = Rows(
        groups=[group_row(g, g[0].project if len(g) else None, g[0].model if len(g) else None,
                          g[0].run if len(g) else None, g[0].step if len(g) else None, now) for g in groups],
        projects={t.project for t in trajs if t.project},
        replace=replace,
    )
    with gc_paused():
        for t in trajs:
            row, calls, choices, rewards = trajectory_rows(t)
            batch.tables[T.TrajectoryRow].append(row)
            batch.tables[T.CallRow].extend(calls)
            batch.tables[T.ChoiceRow].extend(choices)
            batch.tables[T.RewardRow].extend(rewards)
    # SQLite would refuse a string that is not UTF-8 (a lone surrogate) at commit, with the
    # whole batch: the text columns are checked here, in one piece (the JSON columns are
    # pydantic's UTF-8 already)
    text = "".join([v for table, rows in ((T.GroupRow, batch.groups), *batch.tables.items())
                    for v in chain.from_iterable(map(_TEXT[table], rows)) if v.__class__ is str])
    if not text.isascii():
        text.encode("utf-8")
    for p in batch.projects:
        p.encode("utf-8")
    return batch


def _check_rewards(t: Trajectory) -> None:
    if not _bad_reward(t.reward) and not any(map(_bad_reward, t.rewards.values())):
        return
    values = [("reward", t.reward), *((f"rewards[{k!r}]", v) for k, v in t.rewards.items())]
    name, v = next((name, v) for name, v in values if _bad_reward(v))
    raise StoreError(f"trajectory {t.id}: {name} is {v!r}; rewards must be finite numbers (or None for "
                     f"no reward). Nothing of it was written")


def _bad_reward(v: Any) -> bool:
    if type(v) is float:  # nearly every reward: one check, not three
        return not math.isfinite(v)
    return v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v))


def _text_columns(table: Any) -> Callable[[Row], tuple[Any, ...]]:
    """A function giving a row of ``table`` its values that are text as it was given: not
    numbers, nor JSON."""
    text = {c.name for c in table.__table__.columns
            if isinstance(c.type, (sa.String, AutoString)) and c.name not in JSON_COLUMNS}
    at = [i for i, name in enumerate(Rows.COLUMNS[table]) if name in text]
    return itemgetter(*at) if len(at) > 1 else lambda row: tuple(row[i] for i in at)


_TEXT = {table: _text_columns(table) for table in Rows.COLUMNS}


def write(conn: sa.Connection, jobs: Sequence[Job]) -> None:
    """Write what several jobs hold in one transaction: one INSERT per table for all of them
    (a job may instead hold a function that writes, for steps, models and checkpoints)."""
    merged: dict[Any, list[Row]] = {table: [] for table in Rows.ORDER}
    groups: list[Row] = []
    projects: set[str] = set()
    for job in jobs:
        rows = job.rows
        if callable(rows):
            rows(conn)
            continue
        if rows.replace:
            _delete(conn, *rows.ids())
        for table in Rows.ORDER:
            merged[table].extend(rows.tables[table])
        groups.extend(rows.groups)
        projects |= rows.projects
    for p in sorted(projects):
        ensure_project(conn, p)
    _insert(conn, T.GroupRow, groups)
    for table in Rows.ORDER:
        _insert(conn, table, merged[table])


def upsert(table: Any, key: dict[str, Any], values: dict[str, Any]) -> Callable[[sa.Connection], None]:
    """A write that sets ``values`` on the row of ``table`` with ``key``, inserting it if new."""
    t = table.__table__

    def run(conn: sa.Connection) -> None:
        cond = sa.and_(*(t.c[k] == v for k, v in key.items()))
        if conn.execute(sa.select(sa.func.count()).select_from(t).where(cond)).scalar():
            conn.execute(sa.update(t).where(cond).values(**values))
        else:
            conn.execute(sa.insert(t), [{**key, **values}])
        if "project" in key:
            ensure_project(conn, key["project"])

    return run


def merge_metrics(key: dict[str, Any], metrics: dict[str, Any]) -> Callable[[sa.Connection], None]:
    """A write that adds ``metrics`` to the step row with ``key`` (made if there is none), keeping
    what it holds: an evaluation or a batch that trained nothing, filed with its step."""
    from .rows import dumps, loads

    t = T.StepRow.__table__

    def run(conn: sa.Connection) -> None:
        cond = sa.and_(*(t.c[k] == v for k, v in key.items()))
        row = conn.execute(sa.select(t.c.metrics).where(cond)).first()
        if row is None:
            conn.execute(sa.insert(t), [{**key, "metrics": dumps(metrics), "created_at": time.time()}])
        else:
            conn.execute(sa.update(t).where(cond).values(metrics=dumps({**(loads(row[0]) or {}), **metrics})))
        ensure_project(conn, key["project"])

    return run


def ensure_project(conn: sa.Connection, name: str) -> None:
    t = T.ProjectRow.__table__
    if conn.dialect.name == "sqlite":  # one statement, not a look and then a write
        conn.exec_driver_sql(f"INSERT OR IGNORE INTO {t.name} (name, created_at) VALUES (?, ?)", (name, time.time()))
        return
    if conn.execute(sa.select(t.c.name).where(t.c.name == name)).first() is None:
        conn.execute(sa.insert(t), [{"name": name, "created_at": time.time()}])


def _insert(conn: sa.Connection, table: Any, rows: list[Row]) -> None:
    if not rows:
        return
    cols = Rows.COLUMNS[table]
    if conn.dialect.name != "sqlite":
        conn.execute(sa.insert(table.__table__), [dict(zip(cols, r)) for r in rows])
        return
    # several rows a statement (INSERT ... VALUES (...), (...), ...): SQLite inserts them in
    # one step, which lets go of the interpreter lock once for all of them. executemany steps,
    # and takes the lock back, once a row: a writer whose caller is busy serialising the next
    # submissions would wait out the interpreter's switch interval (5 ms) a row. Chunks are
    # powers of two, so a table needs a handful of statements, all kept prepared.
    name = table.__table__.name
    most = _most_rows(conn, len(cols))
    start = 0
    while start < len(rows):
        n = min(most, len(rows) - start)
        n = 1 << (n.bit_length() - 1)
        conn.exec_driver_sql(_values_sql(name, cols, n), tuple(chain.from_iterable(rows[start:start + n])))
        start += n


_ROWS_A_STATEMENT = 512


def _most_rows(conn: sa.Connection, width: int) -> int:
    """How many rows of ``width`` columns one statement may take: as many as this SQLite's
    limit on bound variables allows (32,766 by default; 999 before 3.32), at most 512."""
    getlimit = getattr(conn.connection.dbapi_connection, "getlimit", None)  # a driver other than sqlite3: 999
    variables = getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit is not None else 999
    return max(1, min(_ROWS_A_STATEMENT, variables // width))


@lru_cache(maxsize=256)
def _values_sql(name: str, cols: tuple[str, ...], n: int) -> str:
    one = f"({', '.join('?' * len(cols))})"
    return f"INSERT INTO {name} ({', '.join(cols)}) VALUES {', '.join([one] * n)}"


def _delete(conn: sa.Connection, ids: list[str], group_ids: list[str]) -> None:
    for table in (T.TrajectoryRow, *T.TRAJECTORY_CHILDREN):
        col = table.__table__.c["id" if table is T.TrajectoryRow else "trajectory_id"]
        conn.execute(sa.delete(table.__table__).where(col.in_(ids)))
    if group_ids:
        g = T.GroupRow.__table__
        conn.execute(sa.delete(g).where(g.c.id.in_(group_ids)))
