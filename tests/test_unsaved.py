"""A write the store cannot commit is never lost: each one's data goes to a file of its own
beside the store, no later failure overwrites or truncates it, and `recover` puts it all back
-- with the database locked by another process, and on a full disk."""

import json
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

import artsdk as art
from artsdk.cli import main as cli


def group_of(n: int, tag: str) -> art.Group:
    """A scored group of n trajectories of the same shape (and so the same size)."""
    g = art.Group(rollout=tag)
    g.trajectories = [art.Trajectory(rollout=tag, project="p", reward=float(i % 2), scenario={"i": i},
                                     group_id=g.id, group_index=i) for i in range(n)]
    return g


def submit_group(store: art.Store, g: art.Group):
    return store.submit(g.trajectories, groups=[g])


def test_two_failed_writes_of_the_same_size_under_a_lock_are_both_recovered(tmp_path, capsys):
    path = tmp_path / "s.db"
    store = art.Store(f"sqlite:///{path}?timeout=0.3")
    store.save(art.Trajectory(rollout="before"))
    blocker = sqlite3.connect(path, timeout=0, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    a, b = group_of(8, "a"), group_of(8, "b")
    fa, fb = submit_group(store, a), submit_group(store, b)
    for f in (fa, fb):
        with pytest.raises(art.StoreError, match=r"could not store 8 trajectories: OperationalError: database is "
                                                 r"locked; its data was saved to .*artsdk store recover"):
            f.result(30)
    blocker.execute("ROLLBACK")
    blocker.close()
    files = sorted((tmp_path / "unsaved").glob("*.json"))
    assert len(files) == 2  # the second failure used to overwrite the first
    held = [{t["id"] for t in json.loads(p.read_text())["trajectories"]} for p in files]
    assert sorted(held, key=sorted) == sorted([{t.id for t in a}, {t.id for t in b}], key=sorted)
    assert store.count() == 1
    store.close()

    assert cli(["store", "recover", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 file(s)" in out and "16 trajectories restored" in out and "2 group(s) restored" in out
    with art.Store(path) as back:
        assert back.count() == 17
        stored = {g.id: sorted(t.id for t in g) for g in back.groups()}
        assert stored == {a.id: sorted(t.id for t in a), b.id: sorted(t.id for t in b)}
        assert back.get(a[3].id).scenario == {"i": 3} and back.get(a[3].id).reward == 1.0
        again = back.recover()  # idempotent: nothing left to do
        assert again.files == [] and again.restored == 0
    assert sorted(p.name for p in (tmp_path / "unsaved" / "recovered").glob("*.json")) == [p.name for p in files]


def test_recover_skips_what_is_stored_and_keeps_a_file_it_cannot_read(tmp_path):
    path = tmp_path / "s.db"
    store = art.Store(f"sqlite:///{path}?timeout=0.2")
    g = group_of(4, "g")
    store.save(g[0])  # one of the four is stored already: the group's write fails on it
    with pytest.raises(art.StoreError, match=f"already stored") as e:
        store.save(g.trajectories, groups=[g])
    assert g[0].id in str(e.value)
    (store.unsaved / "junk.json").write_text("{not json")
    report = store.recover()
    assert (report.restored, report.already_stored, report.groups) == (3, 1, 1)
    assert list(report.failed) == ["junk.json"] and "cannot be read" in str(report)
    assert store.count() == 4 and [sorted(t.id for t in x) for x in store.groups()] == [sorted(t.id for t in g)]
    assert (store.unsaved / "junk.json").exists()  # left for a person to look at
    store.close()


def test_an_integrity_error_from_a_trigger_gets_no_duplicate_hint(tmp_path):
    path = tmp_path / "s.db"
    with art.Store(path):
        pass
    with sqlite3.connect(path) as db:
        db.execute("CREATE TRIGGER no_bad BEFORE INSERT ON art_trajectories WHEN NEW.rollout = 'bad' "
                   "BEGIN SELECT RAISE(ABORT, 'rollout bad is refused'); END")
    with art.Store(path) as store:
        t = art.Trajectory(rollout="bad")
        with pytest.raises(art.StoreError) as e:
            store.save(t)
        assert "rollout bad is refused" in str(e.value) and "already stored" not in str(e.value)
        assert "saved to" in str(e.value)


def _mount_tmpfs(where, size: str) -> None:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a small filesystem for the full-disk test needs mount (root): {done.stderr.strip()}")


def _fill(folder) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_failed_writes_on_a_full_disk_wait_in_memory_and_are_all_recovered(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "2m")
    try:
        store = art.Store(f"sqlite:///{disk / 's.db'}?timeout=0.2")
        store.save(art.Trajectory(rollout="before"))
        big = "x" * 20000  # so that the failed writes' own files cannot fit either
        a, b = group_of(8, "a"), group_of(8, "b")
        for t in [*a, *b]:
            t.outcome = big
        _fill(disk)
        for g in (a, b):
            with pytest.raises(art.StoreError, match=r"database or disk is full; writing its data to a file failed "
                                                     r"too .*kept in memory"):
                submit_group(store, g).result(30)
        names = os.listdir(disk / "unsaved") if (disk / "unsaved").exists() else []
        assert [n for n in names if n.endswith(".json")] == []  # no 0-byte or partial file is left
        (disk / "filler").unlink()
        store.save(art.Trajectory(rollout="after"))  # the writer writes what waited once there is room
        store.close()
        files = sorted((disk / "unsaved").glob("*.json"))
        assert len(files) == 2 and all(p.stat().st_size > 100_000 for p in files)
        with art.Store(disk / "s.db") as back:
            report = back.recover()
            assert report.restored == 16 and report.failed == {}
            assert back.count() == 18 and len(back.groups()) == 2
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_new_store_on_a_full_disk_says_so_and_leaves_no_empty_file(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1m")
    try:
        _fill(disk)
        with pytest.raises(art.StoreError, match=r"the disk holding .* is full"):
            art.Store(disk / "new.db")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no 0-byte file to be called a database
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_at_close_a_write_that_still_cannot_be_saved_goes_to_the_temporary_folder(tmp_path, monkeypatch):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1m")
    spare = tmp_path / "tmp"
    spare.mkdir()
    monkeypatch.setenv("TMPDIR", str(spare))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    try:
        store = art.Store(f"sqlite:///{disk / 's.db'}?timeout=0.2")
        g = group_of(4, "g")
        for t in g:
            t.outcome = "y" * 50000
        _fill(disk)
        with pytest.raises(art.StoreError, match="kept in memory"):
            submit_group(store, g).result(30)
        store.close()  # the disk is still full: the data goes to $TMPDIR/artsdk-unsaved
        files = list((spare / "artsdk-unsaved").glob("*.json"))
        assert len(files) == 1
        (disk / "filler").unlink()
        with art.Store(disk / "s.db") as back:
            assert back.recover(spare / "artsdk-unsaved").restored == 4
            assert back.count() == 4
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_many_concurrent_failures_each_keep_their_own_file(tmp_path):
    """Failures from several threads at once, all of the same size: one file each."""
    path = tmp_path / "s.db"
    store = art.Store(f"sqlite:///{path}?timeout=0.1")
    blocker = sqlite3.connect(path, timeout=0, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    groups = [group_of(2, f"t{i}") for i in range(12)]
    errors = []

    def one(g):
        try:
            submit_group(store, g).result(60)
        except art.StoreError as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    blocker.execute("ROLLBACK")
    assert len(errors) == 12
    assert len(list(store.unsaved.glob("*.json"))) == 12
    assert store.recover().restored == 24 and store.count() == 24
    store.close()


def test_a_bad_timeout_in_the_url_is_named(tmp_path):
    with pytest.raises(art.StoreError, match=r"timeout='soon' is not a number of seconds"):
        art.Store(f"sqlite:///{tmp_path / 's.db'}?timeout=soon")


def test_recover_from_the_command_line_says_when_there_is_nothing(tmp_path):
    path = tmp_path / "s.db"
    art.Store(path).close()
    done = subprocess.run([sys.executable, "-m", "artsdk.cli", "store", "recover", "--store", str(path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and "nothing to recover" in done.stdout, done.stderr
