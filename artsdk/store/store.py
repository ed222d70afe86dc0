"""``Store``: what users call to keep and read trajectories. Reads run on the calling thread
(``query.py``); writes are queued to one writer thread (``writer.py``, ``writing.py``)."""

from __future__ import annotations

import atexit
import time
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Optional, Sequence, Union

import sqlalchemy as sa

from ..errors import StoreError
from ..trajectory.records import Group, Trajectory
from . import tables as T
from .database import connect, prepare, sqlite_path, transient
from .query import latest_run, load, load_checkpoints, load_groups, load_runs, load_steps, select_trajectories
from .rows import GROUP_COLUMNS, Rows, dumps
from .unsaved import Recovery, recover
from .writer import Job, Writer
from .writing import merge_metrics, submission, upsert, write

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
        new = self.path is not None and not self.path.exists()
        try:
            prepare(self._engine, self.path, str(self.path) if self.path is not None else self.url, allow_foreign)
        except StoreError:
            if new:  # a file SQLite made and could not write (a full disk): not left behind as a "database"
                _remove_empty(self.path)
            raise
        home = self.path.parent if self.path is not None else Path(cfg.home)
        engine = self._engine
        self.unsaved = home / "unsaved"  # the data of writes that could not be committed (``recover``)
        self._writer = Writer(self._begin, write, self.unsaved, name=self.path.name if self.path else "db",
                              transient=lambda e: transient(e, engine), explain=self._explain)
        self._closed = False
        _open_stores.add(self)

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with self._engine.begin() as conn:
            yield conn

    @property
    def _where(self) -> str:
        return str(self.path or self.url)

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
        return self._writer.submit(submission(trajs, groups, replace))

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

    def _upsert(self, table: Any, key: dict[str, Any], values: dict[str, Any]) -> None:
        self._writer.submit(Job(upsert(table, key, values), f"{table.__tablename__} {key}")).result()

    def record_model(self, project: str, name: str, base_model: str, config: dict[str, Any]) -> None:
        """Remember a trainable model (done by ``art.session``)."""
        self._upsert(T.ModelRow, {"project": project, "name": name},
                     {"base_model": base_model, "config": dumps(config), "created_at": time.time()})

    def record_step(self, project: str, model: str, step: int, metrics: dict[str, Any],
                    checkpoint: Optional[str] = None, run: str = "") -> None:
        """Remember a training step's metrics (in ``run``), and its checkpoint when it wrote one."""
        now = time.time()
        self._upsert(T.StepRow, {"project": project, "model": model, "run": run, "step": step},
                     {"metrics": dumps(metrics), "created_at": now})
        if checkpoint is not None:
            self._upsert(T.CheckpointRow, {"project": project, "model": model, "run": run, "step": step},
                         {"path": checkpoint, "metrics": dumps(metrics), "created_at": now})

    def add_step_metrics(self, project: str, model: str, step: int, metrics: dict[str, Any], run: str = "") -> None:
        """Add ``metrics`` to a step's recorded ones (an evaluation of the model at that step, a
        batch that trained nothing), keeping those it has."""
        self._writer.submit(Job(merge_metrics({"project": project, "model": model, "run": run, "step": step}, metrics),
                                f"metrics of step {step}")).result()

    def record_run(self, project: str, model: str, run: str, base_model: str = "",
                   meta: Optional[dict[str, Any]] = None) -> None:
        """Remember a training run (done by ``art.session``); ``meta`` is merged into what it holds."""
        old = next((r["meta"] for r in self.runs(project=project, model=model) if r["run"] == run), None)
        values: dict[str, Any] = {"meta": dumps({**(old or {}), **(meta or {})})}
        if old is None:
            values.update(base_model=base_model, started_at=time.time())
        self._upsert(T.RunRow, {"project": project, "model": model, "run": run}, values)

    def runs(self, *, project: Optional[str] = None, model: Optional[str] = None) -> list[dict[str, Any]]:
        """Training runs, newest first: ``[{"project", "model", "run", "last_step", "trajectories",
        "started_at", "base_model", "meta"}, ...]``."""
        return load_runs(self._engine, project, model)

    def latest_run(self, project: str, model: str) -> Optional[str]:
        """The model's newest run (None when it has none)."""
        return latest_run(self._engine, project, model)

    def recover(self, folder: Union[str, Path, None] = None) -> Recovery:
        """Put back the writes that failed (a locked database, a full disk): each one's data
        was kept in a file of its own in ``folder`` (default: ``unsaved/`` beside the store).
        Trajectories already stored are skipped, so running it twice is harmless; a file
        fully stored moves to ``unsaved/recovered/``. Returns what was done::

            print(art.Store("runs/store.db").recover())   # also: artsdk store recover
        """
        folder = Path(folder) if folder is not None else self.unsaved

        def write(trajs: list[Trajectory], groups: list[dict[str, Any]], replace: bool) -> None:
            job = submission(trajs, (), replace)
            job.rows.groups = [tuple(g.get(c) for c in GROUP_COLUMNS) for g in groups]  # as the file names them
            job.dump = None  # a failure leaves the file where it is
            self._writer.submit(job).result()

        return recover(folder, self._stored, write)

    def _stored(self, ids: Sequence[str], group_ids: Sequence[str]) -> tuple[set[str], set[str]]:
        """Which of these trajectory and group ids the store holds."""
        t, g = T.TrajectoryRow.__table__, T.GroupRow.__table__
        have: set[str] = set()
        groups: set[str] = set()
        with self._engine.connect() as conn:
            for i in range(0, len(ids), 500):
                have |= set(conn.execute(sa.select(t.c.id).where(t.c.id.in_(ids[i:i + 500]))).scalars())
            for i in range(0, len(group_ids), 500):
                groups |= set(conn.execute(sa.select(g.c.id).where(g.c.id.in_(group_ids[i:i + 500]))).scalars())
        return have, groups

    def _explain(self, job: Job, exc: BaseException) -> str:
        """A hint for a write refused as a duplicate, only where it is one."""
        if not isinstance(exc, sa.exc.IntegrityError) or not isinstance(job.rows, Rows):
            return ""
        have, groups = self._stored(*job.rows.ids())
        if have:
            return (f" (trajectory {', '.join(sorted(have)[:3])} is already stored; save(..., replace=True) "
                    f"overwrites it)")
        if groups:
            return f" (group {', '.join(sorted(groups)[:3])} is already stored)"
        return ""

    # ---- reading -----------------------------------------------------------------------

    def trajectories(
        self, *, project: Optional[str] = None, model: Optional[str] = None, run: Optional[str] = None,
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
        q = select_trajectories(project=project, model=model, run=run, step=step, rollout=rollout,
                                group_id=group_id, ids=ids, min_reward=min_reward,
                                max_reward=max_reward, error=error)
        order = t.c.started_at.desc() if newest_first else t.c.started_at
        q = q.order_by(order, t.c.id).offset(offset)
        if limit is not None:
            q = q.limit(limit)
        every = q.whereclause is None and limit is None and not offset
        return load(self._engine, q, self._where, every=every)

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
        found = load(self._engine, q, self._where)
        if not found:
            raise StoreError(f"no trajectory {trajectory_id!r} in {self._where}")
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
        self, *, project: Optional[str] = None, model: Optional[str] = None, run: Optional[str] = None,
        step: Optional[int] = None, ids: Optional[Sequence[str]] = None,
    ) -> list[Group]:
        """Stored groups with their trajectories (in group order), ready for training."""
        return load_groups(self._engine, self._where, project=project, model=model, run=run, step=step, ids=ids)

    def steps(self, project: str, model: str, run: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded training steps of a model's run (default: its newest run):
        ``[{"step": 1, "run": ..., "metrics": {...}}, ...]``."""
        return load_steps(self._engine, project, model, run)

    def checkpoints(self, project: str, model: str, run: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded checkpoints of a model's run (default: its newest run), oldest step first."""
        return load_checkpoints(self._engine, project, model, run)

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
        self._writer.submit(Job(lambda conn: None, "flush")).result()

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
        return f"Store({self._where!r})"


def _remove_empty(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_size == 0:
                p.unlink()
        except OSError:
            pass


async def wait(future: "Future[Any]") -> Any:
    """Await a writer future from async code without blocking the event loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another event loop (trio): wait on a worker thread
        import anyio

        return await anyio.to_thread.run_sync(future.result)
    return await asyncio.wrap_future(future)


@atexit.register
def _close_all() -> None:
    # commit whatever rollouts queued before the interpreter exits
    for s in list(_open_stores):
        try:
            s.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
