"""One writer thread per store: rollouts hand it trajectories and go on; it commits what
has queued up in one transaction at a time. The event loop never waits on SQLite, and a
single writer connection cannot meet "database is locked" from itself.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Optional

from ..futures import settle
from .unsaved import describe_failure, keep

log = logging.getLogger("artsdk.store")

_MAX_BATCH = 512
_STOP = object()


class Job:
    """Rows to write (or a function writing them), and the future that says they were."""

    __slots__ = ("rows", "future", "describe", "dump")

    def __init__(self, rows: Any, describe: str, dump: Optional[Callable[[], str]] = None) -> None:
        self.rows = rows
        self.future: Future[None] = Future()
        self.describe = describe
        self.dump = dump


class Writer:
    def __init__(self, begin: Callable[[], Any], write: Callable[[Any, list[Job]], None],
                 unsaved_dir: Path, name: str, transient: Callable[[BaseException], bool] = lambda e: False,
                 outage_s: float = 600.0, explain: Callable[[Job, BaseException], str] = lambda j, e: "") -> None:
        self._begin = begin  # -> context manager yielding a connection in a transaction
        self._write = write  # (connection, jobs) -> None: writes all the jobs' rows
        # a database server that went away (restarted, a network blip): its writes wait for it,
        # tried again for up to outage_s, before they count as failed
        self._transient, self._outage_s = transient, outage_s
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._unsaved_dir = unsaved_dir
        self._explain = explain  # (job, error) -> a hint that is true of this failure, or ""
        # failed writes whose file could not be written either (a full disk): (text, label),
        # written as soon as that works, at the latest at close
        self._parked: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=self._run, name=f"artsdk-store-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future[None]:
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 60.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=2.0 if self._parked else None)
            except queue.Empty:
                self._unpark()
                continue
            batch = [item]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(j is _STOP for j in batch)
            jobs = [j for j in batch if j is not _STOP]
            if jobs:
                try:
                    self._commit(jobs)
                except BaseException as e:  # noqa: BLE001 - the writer outlives any one batch
                    log.exception("the store's writer failed")
                    for job in jobs:
                        settle(job.future, error=e)
            if self._parked:
                self._unpark(final=stop)
            if stop:
                return

    def _commit(self, jobs: list[Job]) -> None:
        deadline, delay = None, 0.2
        while True:
            try:
                with self._begin() as conn:
                    self._write(conn, jobs)
                break
            except Exception as e:
                now = time.monotonic()
                if self._transient(e) and now < (deadline := deadline or now + self._outage_s):
                    if delay == 0.2:
                        log.warning("the store cannot be reached (%s); %d write(s) wait and are tried again for up "
                                    "to %.0fs", " ".join(str(e).split())[:200], len(jobs), self._outage_s)
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if len(jobs) == 1:
                    self._fail(jobs[0], e)
                    return
                # one bad job must not take the others down with it: retry them one by one
                for job in jobs:
                    self._commit([job])
                return
        if delay > 0.2:
            log.warning("the store is reachable again: the %d write(s) that waited are stored", len(jobs))
        for job in jobs:
            settle(job.future, None)

    def _fail(self, job: Job, exc: BaseException) -> None:
        """Settle a job that could not be committed with a StoreError saying why, its data
        written to a file of its own beside the store (nothing is lost; ``unsaved.py``), or
        kept in memory until such a file can be written. Never raises."""
        from ..errors import StoreError

        where = ""
        if job.dump is not None:
            text = path = error = None
            try:
                text = job.dump()
                path = keep(self._unsaved_dir, text, job.describe)
            except Exception as e:  # noqa: BLE001 - say so, and go on
                error = e
                if text is not None:
                    self._parked.append((text, job.describe))
            where = describe_failure(path, error, len(self._parked))
        reason = f"{type(exc).__name__}: {' '.join(str(getattr(exc, 'orig', None) or exc).split())}"  # one line
        try:
            reason += self._explain(job, exc)
        except Exception:  # noqa: BLE001 - a hint is never worth a lost error
            pass
        err = StoreError(f"could not store {job.describe}: {reason}{where}")
        log.error("%s", err)
        settle(job.future, error=err)

    def _unpark(self, final: bool = False) -> None:
        """Write the files of failed writes that could not be written before. At close, a
        write that still cannot go beside the store goes to the temporary folder instead."""
        import tempfile

        folders = [self._unsaved_dir]
        if final:
            folders.append(Path(tempfile.gettempdir()) / "artsdk-unsaved")
        still: list[tuple[str, str]] = []
        for text, label in self._parked:
            for folder in folders:
                try:
                    path = keep(folder, text, label)
                except Exception as e:  # noqa: BLE001 - tried again later, or reported below
                    error = e
                    continue
                log.warning("the data of a write that failed (%s) is now saved to %s", label, path)
                break
            else:
                still.append((text, label))
                if final:
                    log.critical("the data of a write that failed (%s) could not be saved anywhere (%s: %s); "
                                 "it is lost when this process ends", label, type(error).__name__, error)
        self._parked = still
