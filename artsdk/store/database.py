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
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 60}
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
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
    return engine


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
            if "art_meta" in names:
                row = conn.execute(sa.text("SELECT value FROM art_meta WHERE key='schema_version'")).first()
                version = int(row[0]) if row else 0
                if version > T.SCHEMA_VERSION:
                    raise StoreError(
                        f"{where} was written by a newer artsdk (schema {version}, this "
                        f"version reads {T.SCHEMA_VERSION}); upgrade artsdk"
                    )
        if path is not None:
            # set only once the file is known to be ours: WAL rewrites the file header
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        T.metadata.create_all(engine)
        with engine.begin() as conn:  # indexes added since a store was made (create_all adds only new tables)
            for table in T.metadata.tables.values():
                for index in table.indexes:
                    index.create(conn, checkfirst=True)
        with engine.begin() as conn:
            if conn.execute(sa.text("SELECT 1 FROM art_meta WHERE key='schema_version'")).first() is None:
                conn.execute(sa.insert(T.MetaRow.__table__),
                             [{"key": "schema_version", "value": str(T.SCHEMA_VERSION)}])
    except StoreError:
        engine.dispose()
        raise
    except sa.exc.DatabaseError as e:
        engine.dispose()
        raise StoreError(f"cannot open store {where}: {e.orig}; {_hint(path, e)}") from None


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
    return "it is not an SQLite database or it is corrupt; move it aside and start a new store"
