"""Writes the store could not commit: each kept in a file of its own beside the store
(``unsaved/``), and put back into a store by ``recover``.

A file is written under a temporary name, synced, then renamed to a name no other write
uses (time, a random part, what it holds), so no later failure can overwrite or truncate
it, and a write cut short (a full disk) leaves no partial file behind, only the temporary
one, which ``recover`` ignores.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

RECOVERED = "recovered"  # the subfolder a file moves to once everything in it is stored


def keep(folder: Path, text: str, label: str) -> Path:
    """Write ``text`` to a new file in ``folder`` atomically; returns its path. OSError when
    it cannot be written (nothing is left under the final name then)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}-{label.replace(' ', '-')}.json"
    tmp = folder / f".{name}.tmp"
    try:
        with open(tmp, "x", encoding="ascii") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, folder / name)  # a fresh name: never onto another write's file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(folder)
    return folder / name


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pending(folder: Path) -> list[Path]:
    """The files of writes not yet put back, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.is_file())


@dataclass
class Recovery:
    """What ``Store.recover`` did: ``restored`` trajectories written, ``already_stored`` found
    in the store already (skipped), ``groups`` group rows written, and per file that could
    not be read or written, why (``failed``). ``files`` were read; those fully stored moved
    to ``unsaved/recovered/``."""

    folder: str
    files: list[str] = field(default_factory=list)
    restored: int = 0
    already_stored: int = 0
    groups: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.files:
            return f"nothing to recover in {self.folder}"
        text = (f"{len(self.files)} file(s) in {self.folder}: {self.restored} trajectories restored, "
                f"{self.already_stored} already stored, {self.groups} group(s) restored")
        for name, why in self.failed.items():
            text += f"\n  {name}: not recovered: {why}"
        return text


def recover(folder: Path, stored: Callable[[list[str], list[str]], tuple[set[str], set[str]]],
            write: Callable[[list[Any], list[dict[str, Any]], bool], None]) -> Recovery:
    """Put every pending file of ``folder`` back: ``stored(trajectory ids, group ids)`` says
    which are in the store already, ``write(trajectories, group rows, replace)`` commits the
    rest. A file whose content is all stored moves to ``recovered/``, so a second run has
    nothing to do; a file that fails stays where it is."""
    from ..trajectory.records import Trajectory

    report = Recovery(folder=str(folder))
    for path in pending(folder):
        report.files.append(path.name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            trajs = [Trajectory.model_validate(t) for t in data["trajectories"]]
            groups: list[dict[str, Any]] = list(data.get("groups") or [])
            replace = bool(data.get("replace", False))
        except (OSError, ValueError, KeyError, TypeError) as e:
            report.failed[path.name] = f"cannot be read ({type(e).__name__}: {e})"
            continue
        have, have_groups = stored([t.id for t in trajs], [g["id"] for g in groups])
        todo = trajs if replace else [t for t in trajs if t.id not in have]
        new_groups = [g for g in groups if g["id"] not in have_groups]
        try:
            if todo or new_groups:
                write(todo, new_groups, replace)
        except Exception as e:  # noqa: BLE001 - reported per file; the file stays
            report.failed[path.name] = f"{type(e).__name__}: {e}"
            continue
        report.restored += len(todo)
        report.already_stored += len(trajs) - len(todo)
        report.groups += len(new_groups)
        done = folder / RECOVERED
        done.mkdir(exist_ok=True)
        os.replace(path, done / path.name)
    return report


def describe_failure(path: Optional[Path], error: Optional[BaseException], parked: int) -> str:
    """The end of a failed write's message: where its data is, and how to put it back."""
    if path is not None:
        return f"; its data was saved to {path} (`artsdk store recover` puts it back)"
    return (f"; writing its data to a file failed too ({type(error).__name__}: {error}): it is kept in memory "
            f"({parked} write(s) waiting) and written to unsaved/ as soon as that works, at the latest when "
            f"the store closes; then `artsdk store recover` puts it back")
