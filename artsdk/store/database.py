"""Opening the store's database: the engine, SQLite's settings, and a check that the file
is ours (or new) before anything is written to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import StoreError
from . import tables as T


def sqlite_path(url: sa.engine.URL) -> Optional[Path]:
    """The file of an SQLite URL (None for another database or an in-memory one)."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def connect(url: sa.engine.URL, path: Optional[Path]) -> sa.engine.Engine:
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the folder for store {path}: {e}") from None
        # how long a write waits for another process's transaction: 60 s, or the URL's
        # ?timeout=SECONDS (sqlite:///runs/store.db?timeout=5)
        timeout = _seconds(url.query.get("timeout", 60), url)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": timeout}
    else:  # a server: a pooled connection it dropped (a restart) is noticed before use
        kwargs["pool_pre_ping"] = True
    try:
        engine = sa.create_engine(url, **kwargs)
    except (ModuleNotFoundError, sa.exc.NoSuchModuleError) as e:
        raise StoreError(
            f"cannot open store {url.render_as_string(hide_password=True)!r}: {e}. Install the "
            f"database driver the URL names, or use a path for an SQLite file"
        ) from None
    if url.get_backend_name() == "sqlite":
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
    return engine


def _seconds(value: Any, url: sa.engine.URL) -> float:
    try:
        seconds = float(value if isinstance(value, (str, int, float)) else value[-1])
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:
        raise StoreError(f"store URL {url}: timeout={value!r} is not a number of seconds; give e.g. ?timeout=30")
    return seconds


def transient(e: BaseException, engine: sa.engine.Engine) -> bool:
    """A database server that cannot be reached (or dropped the connection): its writes are
    worth trying again. Never for SQLite, whose errors do not pass by waiting."""
    if engine.dialect.name == "sqlite" or not isinstance(e, sa.exc.DBAPIError):
        return False
    return bool(e.connection_invalidated) or isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError))


def prepare(engine: sa.engine.Engine, path: Optional[Path], where: str, allow_foreign: bool) -> None:
    """Refuse a corrupt, foreign or newer database; create the tables; switch SQLite to WAL."""
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            ours = {t for t in names if t.startswith("art_")}
            if names and not ours and path is not None and not allow_foreign:
                raise StoreError(
                    f"{where} is an SQLite database of another application (tables: "
                    f"{', '.join(sorted(names)[:5])}); point `store` at a new file, or pass "
                    f"allow_foreign=True to add artsdk's tables beside them"
                )
            version = T.SCHEMA_VERSION
            if "art_meta" in names:
                row = conn.execute(sa.text("SELECT value FROM art_meta WHERE key='schema_version'")).first()
                version = int(row[0]) if row else T.SCHEMA_VERSION
                if version > T.SCHEMA_VERSION:
                    raise StoreError(
                        f"{where} was written by a newer artsdk (schema {version}, this "
                        f"version reads {T.SCHEMA_VERSION}); upgrade artsdk"
                    )
        if path is not None:
            # set only once the file is known to be ours: WAL rewrites the file header
            _retry_locked(lambda: _wal(engine))
        if version < T.SCHEMA_VERSION:
            _retry_locked(lambda: _migrate(engine))
        _retry_locked(lambda: _create(engine))
    except StoreError:
        engine.dispose()
        raise
    except sa.exc.DatabaseError as e:
        engine.dispose()
        raise StoreError(f"cannot open store {where}: {e.orig}; {_hint(path, e)}") from None


def _wal(engine: sa.engine.Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")


def _retry_locked(work: Any, seconds: float = 60.0) -> None:
    """``work()``, again while SQLite says the database is locked: switching a new file to WAL
    while another process opens it too answers "locked" at once, without waiting."""
    import time

    deadline = time.monotonic() + seconds
    delay = 0.01
    while True:
        try:
            return work()
        except sa.exc.OperationalError as e:
            if "locked" not in str(e.orig).lower() or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


# schema 2 keys steps and checkpoints by run as well: the tables are rebuilt with the new key
_KEYED_BY_RUN = {
    "art_steps": "project VARCHAR NOT NULL, model VARCHAR NOT NULL, run VARCHAR NOT NULL DEFAULT '', "
                 "step INTEGER NOT NULL, metrics VARCHAR NOT NULL, created_at FLOAT NOT NULL",
    "art_checkpoints": "project VARCHAR NOT NULL, model VARCHAR NOT NULL, run VARCHAR NOT NULL DEFAULT '', "
                       "step INTEGER NOT NULL, path VARCHAR NOT NULL, metrics VARCHAR NOT NULL, "
                       "created_at FLOAT NOT NULL",
}


def _migrate(engine: sa.engine.Engine) -> None:
    """A store of schema 1 brought to 2 (runs): a ``run`` column on trajectories and groups,
    steps and checkpoints keyed by run (their rows get the run "", before runs). Each part
    checks what is done, so a migration cut short finishes the next time."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7410298)")
        row = conn.execute(sa.text("SELECT value FROM art_meta WHERE key='schema_version'")).first()
        if row is not None and int(row[0]) >= 2:
            return  # another process did it meanwhile
        inspector = sa.inspect(conn)
        for table in ("art_trajectories", "art_groups"):
            if "run" not in {c["name"] for c in inspector.get_columns(table)}:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN run VARCHAR")
        for table, columns in _KEYED_BY_RUN.items():
            if "run" in {c["name"] for c in inspector.get_columns(table)}:
                continue
            old = [c["name"] for c in inspector.get_columns(table)]
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_v2")
            conn.exec_driver_sql(f"CREATE TABLE {table}_v2 ({columns}, PRIMARY KEY (project, model, run, step))")
            conn.exec_driver_sql(f"INSERT INTO {table}_v2 ({', '.join(old)}, run) SELECT {', '.join(old)}, '' "
                                 f"FROM {table}")
            conn.exec_driver_sql(f"DROP TABLE {table}")
            conn.exec_driver_sql(f"ALTER TABLE {table}_v2 RENAME TO {table}")
        conn.execute(sa.text("UPDATE art_meta SET value = :v WHERE key = 'schema_version'"),
                     {"v": str(T.SCHEMA_VERSION)})


def _create(engine: sa.engine.Engine) -> None:
    """The tables, indexes and schema version, made so that several processes opening a new
    store at once all succeed: every statement is ``IF NOT EXISTS`` / ``ON CONFLICT DO
    NOTHING`` (create-after-check would race), and on PostgreSQL one creator at a time."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7410298)")  # released at commit
        for table in T.metadata.sorted_tables:
            conn.execute(CreateTable(table, if_not_exists=True))
            for index in table.indexes:  # indexes added since a store was made too
                conn.execute(CreateIndex(index, if_not_exists=True))
        conn.execute(sa.text("INSERT INTO art_meta (key, value) VALUES ('schema_version', :v) "
                             "ON CONFLICT DO NOTHING"), {"v": str(T.SCHEMA_VERSION)})


def _hint(path: Optional[Path], e: sa.exc.DatabaseError) -> str:
    """What to do about a database that would not open, judged by what is on disk."""
    import os

    if path is None:
        return "check the URL and the server"
    if not path.exists() or "readonly" in str(e.orig).lower() or "unable to open" in str(e.orig).lower():
        folder = path.parent
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            return (f"{folder if not path.exists() else path} is not writable by this user; point `store` "
                    f"at a folder you can write to, or fix the permissions")
        return "check that the folder exists and can be written to"
    try:
        with open(path, "rb") as f:
            header = f.read(16)
    except OSError as oe:
        return f"it cannot be read ({oe})"
    if not header or "full" in str(e.orig).lower():
        import shutil

        free = shutil.disk_usage(path.parent).free
        if free < 1024 * 1024 or "full" in str(e.orig).lower():
            return (f"the disk holding {path.parent} is full ({free} bytes free): free some space, or point "
                    f"`store` at another disk")
        if not header:
            return (f"{path} is an empty file, not a database: move it aside (or delete it) and a new store is "
                    f"made there")
    if header == b"SQLite format 3\x00":
        return "it is an SQLite database; the error above is what SQLite said (retry if another process was busy with it)"
    return "it is not an SQLite database or it is corrupt; move it aside and start a new store"
