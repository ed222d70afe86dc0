"""The trajectory store: SQLite by default (WAL mode), any SQLAlchemy URL for teams.

```python
store = art.Store("runs/store.db")                  # or "postgresql+psycopg://..."
best = store.trajectories(project="ttt", min_reward=0.9, limit=20)
store.export_jsonl("ttt.jsonl", project="ttt")
groups = store.groups(project="ttt", model="agent", step=3)   # back to art.Group for training
```
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Optional, Sequence, Union

import sqlalchemy as sa

from ..errors import StoreError
from ..trajectory import Group, Trajectory
from . import tables as T
from .database import connect, prepare, sqlite_path
from .query import load, select_trajectories
from .rows import Rows, dumps, gc_paused, group_row, loads, trajectory_rows
from .writer import Job, Writer

__all__ = ["Store", "default_store", "reset_default"]

_open_stores: "weakref.WeakSet[Store]" = weakref.WeakSet()


class Store:
    """A trajectory store. ``Store()`` opens the configured default; ``Store(path_or_url)``
    any other. Reads run on the calling thread; writes go through one writer thread.

    ``allow_foreign=True`` lets the store add its ``art_*`` tables to an SQLite file that
    already holds other tables (refused by default, so a mistyped path cannot touch another
    application's database).
    """

    def __init__(self, url: Union[str, Path, None] = None, *, allow_foreign: bool = False) -> None:
        from ..config import settings

        cfg = settings()
        raw = str(url) if url is not None else cfg.store_url
        self.url = raw if "://" in raw else f"sqlite:///{raw}"
        try:
            parsed = sa.engine.make_url(self.url)
        except sa.exc.ArgumentError as e:
            raise StoreError(f"store URL {self.url!r} is not a valid SQLAlchemy URL: {e}") from None
        self.path = sqlite_path(parsed)
        self._engine = connect(parsed, self.path)
        prepare(self._engine, self.path, str(self.path) if self.path is not None else self.url, allow_foreign)
        home = self.path.parent if self.path is not None else Path(cfg.home)
        self._writer = Writer(self._begin, self._write, home / "unsaved",
                              name=self.path.name if self.path else "db")
        self._closed = False
        _open_stores.add(self)

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with self._engine.begin() as conn:
            yield conn

    # ---- writing -----------------------------------------------------------------------

    def submit(
        self, trajectories: Union[Trajectory, Iterable[Trajectory]], *,
        groups: Sequence[Group] = (), replace: bool = False,
    ) -> "Future[None]":
        """Queue trajectories (and group rows) for writing; returns at once with a future
        that completes when they are committed."""
        if self._closed:
            raise StoreError(f"store {self.url} is closed")
        trajs = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
        now = time.time()
        batch = Rows(
            groups=[group_row(g, g[0].project if len(g) else None, g[0].model if len(g) else None,
                              g[0].step if len(g) else None, now) for g in groups],
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
        label = f"trajectory {trajs[0].id}" if len(trajs) == 1 else f"{len(trajs)} trajectories"

        def dump() -> str:
            return dumps({"trajectories": [t.model_dump(mode="json", fallback=repr) for t in trajs],
                          "groups": batch.groups})

        return self._writer.submit(Job(batch, label, dump))

    def _write(self, conn: sa.Connection, jobs: Sequence[Job]) -> None:
        """Write what several jobs hold in one go: one INSERT per table for all of them."""
        merged = {table: [] for table in Rows.ORDER}  # type: dict[Any, list[dict[str, Any]]]
        groups: list[dict[str, Any]] = []
        projects: set[str] = set()
        for job in jobs:
            rows = job.rows
            if callable(rows):  # a one-off write (steps, models, checkpoints)
                rows(conn)
                continue
            if rows.replace:
                self._delete(conn, [r["id"] for r in rows.tables[T.TrajectoryRow]],
                             [g["id"] for g in rows.groups])
            for table in Rows.ORDER:
                merged[table].extend(rows.tables[table])
            groups.extend(rows.groups)
            projects |= rows.projects
        for p in sorted(projects):
            self._ensure_project(conn, p)
        self._insert(conn, T.GroupRow, groups)
        for table in Rows.ORDER:
            self._insert(conn, table, merged[table])

    def _insert(self, conn: sa.Connection, table: Any, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        t = table.__table__
        if self._engine.dialect.name == "sqlite":
            # the DB-API executemany with tuples: about twice as fast as a Core insert of
            # dicts, which spends its time processing each row's parameters
            # (every row of a table is built by one dict literal: same keys, same order)
            cols = list(rows[0])
            sql = f"INSERT INTO {t.name} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            conn.exec_driver_sql(sql, [tuple(r.values()) for r in rows])
        else:
            conn.execute(sa.insert(t), rows)

    def _delete(self, conn: sa.Connection, ids: list[str], group_ids: list[str]) -> None:
        for table in (T.TrajectoryRow, *T.TRAJECTORY_CHILDREN):
            col = table.__table__.c["id" if table is T.TrajectoryRow else "trajectory_id"]
            conn.execute(sa.delete(table.__table__).where(col.in_(ids)))
        if group_ids:
            g = T.GroupRow.__table__
            conn.execute(sa.delete(g).where(g.c.id.in_(group_ids)))

    def save(self, trajectories: Union[Trajectory, Iterable[Trajectory]], *,
             groups: Sequence[Group] = (), replace: bool = False) -> None:
        """Write trajectories and wait until they are committed (raises StoreError)."""
        self.submit(trajectories, groups=groups, replace=replace).result()

    async def asave(self, trajectories: Union[Trajectory, Iterable[Trajectory]], *,
                    groups: Sequence[Group] = (), replace: bool = False) -> None:
        """``save`` for async code: waits for the commit without blocking the event loop."""
        await wait(self.submit(trajectories, groups=groups, replace=replace))

    def save_group(self, group: Group) -> None:
        """Write a group and its trajectories."""
        self.save(group.trajectories, groups=[group])

    def _ensure_project(self, conn: sa.Connection, name: str) -> None:
        t = T.ProjectRow.__table__
        if conn.execute(sa.select(t.c.name).where(t.c.name == name)).first() is None:
            conn.execute(sa.insert(t), [{"name": name, "created_at": time.time()}])

    def _upsert(self, table: Any, key: dict[str, Any], values: dict[str, Any]) -> None:
        t = table.__table__

        def write(conn: sa.Connection) -> None:
            cond = sa.and_(*(t.c[k] == v for k, v in key.items()))
            if conn.execute(sa.select(sa.func.count()).select_from(t).where(cond)).scalar():
                conn.execute(sa.update(t).where(cond).values(**values))
            else:
                conn.execute(sa.insert(t), [{**key, **values}])
            if "project" in key:
                self._ensure_project(conn, key["project"])

        self._writer.submit(Job(write, f"{t.name} {key}")).result()  # type: ignore[arg-type]

    def record_model(self, project: str, name: str, base_model: str, config: dict[str, Any]) -> None:
        """Remember a trainable model (done by ``art.session``)."""
        self._upsert(T.ModelRow, {"project": project, "name": name},
                     {"base_model": base_model, "config": dumps(config), "created_at": time.time()})

    def record_step(self, project: str, model: str, step: int, metrics: dict[str, Any],
                    checkpoint: Optional[str] = None) -> None:
        """Remember a training step's metrics, and its checkpoint when it wrote one."""
        now = time.time()
        self._upsert(T.StepRow, {"project": project, "model": model, "step": step},
                     {"metrics": dumps(metrics), "created_at": now})
        if checkpoint is not None:
            self._upsert(T.CheckpointRow, {"project": project, "model": model, "step": step},
                         {"path": checkpoint, "metrics": dumps(metrics), "created_at": now})

    # ---- reading -----------------------------------------------------------------------

    def trajectories(
        self, *, project: Optional[str] = None, model: Optional[str] = None,
        step: Optional[int] = None, rollout: Optional[str] = None,
        group_id: Optional[str] = None, ids: Optional[Sequence[str]] = None,
        min_reward: Optional[float] = None, max_reward: Optional[float] = None,
        error: Optional[bool] = None, limit: Optional[int] = None, offset: int = 0,
        newest_first: bool = False,
    ) -> list[Trajectory]:
        """Stored trajectories matching every given filter, oldest first.

        ``error=True`` keeps only failed rollouts, ``error=False`` only finished ones.
        """
        t = T.TrajectoryRow.__table__
        q = select_trajectories(project=project, model=model, step=step, rollout=rollout,
                           group_id=group_id, ids=ids, min_reward=min_reward,
                           max_reward=max_reward, error=error)
        order = t.c.started_at.desc() if newest_first else t.c.started_at
        q = q.order_by(order, t.c.id).offset(offset)
        if limit is not None:
            q = q.limit(limit)
        return self._load(q)

    def _load(self, q: sa.Select) -> list[Trajectory]:
        return load(self._engine, q, str(self.path or self.url))

    def get(self, trajectory_id: str) -> Trajectory:
        """One trajectory by id (a unique prefix of at least 6 characters also works)."""
        t = T.TrajectoryRow.__table__
        q = select_trajectories()
        if len(trajectory_id) < 32:
            if len(trajectory_id) < 6:
                raise StoreError(f"trajectory id {trajectory_id!r} is too short; give at least 6 characters")
            q = q.where(t.c.id.like(trajectory_id + "%")).limit(2)
        else:
            q = q.where(t.c.id == trajectory_id)
        found = self._load(q)
        if not found:
            raise StoreError(f"no trajectory {trajectory_id!r} in {self.path or self.url}")
        if len(found) > 1:
            raise StoreError(f"trajectory id prefix {trajectory_id!r} is ambiguous; give more characters")
        return found[0]

    def count(self, **filters: Any) -> int:
        """How many trajectories match the filters (same names as ``trajectories``)."""
        q = sa.select(sa.func.count()).select_from(select_trajectories(**filters).subquery())
        with self._engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

    def iter_trajectories(self, *, batch: int = 1000, **filters: Any) -> Iterator[Trajectory]:
        """Every matching trajectory, read ``batch`` at a time (bounded memory)."""
        offset = 0
        while True:
            page = self.trajectories(limit=batch, offset=offset, **filters)
            yield from page
            if len(page) < batch:
                return
            offset += batch

    def groups(
        self, *, project: Optional[str] = None, model: Optional[str] = None,
        step: Optional[int] = None, ids: Optional[Sequence[str]] = None,
    ) -> list[Group]:
        """Stored groups with their trajectories (in group order), ready for training."""
        g = T.GroupRow.__table__
        q = sa.select(g)
        for col, value in (("project", project), ("model", model), ("step", step)):
            if value is not None:
                q = q.where(g.c[col] == value)
        if ids is not None:
            q = q.where(g.c.id.in_(list(ids)))
        with self._engine.connect() as conn:
            group_rows = conn.execute(q.order_by(g.c.created_at, g.c.id)).all()
        if not group_rows:
            return []
        t = T.TrajectoryRow.__table__
        tq = sa.select(t).where(t.c.group_id.in_(sa.select(q.subquery().c.id)))
        members: dict[str, list[Trajectory]] = {}
        for traj in self._load(tq):
            members.setdefault(traj.group_id or "", []).append(traj)
        out = []
        for row in group_rows:
            trajs = sorted(members.get(row.id, []), key=lambda x: (x.group_index or 0, x.attempt))
            # only the last attempt of a retried rollout is a member of its group
            last: dict[int, Trajectory] = {}
            for x in trajs:
                last[x.group_index or 0] = x
            out.append(Group(id=row.id, rollout=row.rollout, scenario=loads(row.scenario),
                             trajectories=list(last.values())))
        return out

    def steps(self, project: str, model: str) -> list[dict[str, Any]]:
        """Recorded training steps of a model: ``[{"step": 1, "metrics": {...}}, ...]``."""
        s = T.StepRow.__table__
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(s).where(s.c.project == project, s.c.model == model)
                                .order_by(s.c.step)).all()
        return [{"step": r.step, "metrics": loads(r.metrics), "created_at": r.created_at} for r in rows]

    def checkpoints(self, project: str, model: str) -> list[dict[str, Any]]:
        """Recorded checkpoints of a model, oldest step first."""
        c = T.CheckpointRow.__table__
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(c).where(c.c.project == project, c.c.model == model)
                                .order_by(c.c.step)).all()
        return [{"step": r.step, "path": r.path, "metrics": loads(r.metrics)} for r in rows]

    def export_jsonl(self, out: Union[str, Path, IO[str]], **filters: Any) -> int:
        """Write matching trajectories to a JSON Lines file, one per line; returns the count."""
        close = False
        if isinstance(out, (str, Path)):
            fh: IO[str] = open(out, "w", encoding="utf-8")
            close = True
        else:
            fh = out
        n = 0
        try:
            for traj in self.iter_trajectories(**filters):
                fh.write(traj.model_dump_json(fallback=repr))
                fh.write("\n")
                n += 1
        finally:
            if close:
                fh.close()
        return n

    # ---- lifetime ----------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until everything submitted so far is committed."""
        self._writer.submit(Job(lambda conn: None, "flush")).result()  # type: ignore[arg-type]

    def close(self) -> None:
        """Commit what is queued, stop the writer and release the database."""
        if not self._closed:
            self._closed = True
            self._writer.close()
            self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path) if self.path else self.url!r})"


async def wait(future: "Future[Any]") -> Any:
    """Await a writer future from async code without blocking the event loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another event loop (trio): wait on a worker thread
        import anyio

        return await anyio.to_thread.run_sync(future.result)
    return await asyncio.wrap_future(future)


_default: Optional[Store] = None
_default_lock = threading.Lock()


def default_store() -> Store:
    """The store named by the settings, opened once per process."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Store()
        return _default


def reset_default() -> None:
    """Close the default store so the next use reopens it from the (new) settings."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = None


@atexit.register
def _close_all() -> None:
    # commit whatever rollouts queued before the interpreter exits
    for s in list(_open_stores):
        try:
            s.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
