"""Nothing stored is lost to its content, and no store write takes the writer down: a lone
surrogate anywhere in a trajectory, several processes opening a new store at once, a NaN
reward handed to the store directly."""

import math
import multiprocessing
import os
import sys

import pytest

import artsdk as art
from artsdk.store.storable import ESCAPED

pytestmark = pytest.mark.anyio
BAD = "caf\udce9.txt"  # what Python gives for a file name that is not UTF-8 (os.fsdecode of b"caf\xe9.txt")


async def test_a_lone_surrogate_in_one_rollout_loses_nothing_and_gather_returns(tmp_path, server, async_client):
    art.configure(store=str(tmp_path / "s.db"))

    @art.rollout(name="reads-files")
    async def agent(i: int) -> str:
        r = await async_client.chat.completions.create(model="gpt-4o-mini" if i != 3 else f"m-{BAD}",
                                                       messages=[{"role": "user", "content": f"open {i}"}])
        if i == 5:
            raise FileNotFoundError(f"no such file: {BAD}")
        return r.choices[0].message.content if i != 7 else {"path": BAD}

    @art.reward
    def one(t: art.Trajectory) -> float:
        return 1.0 if t.scenario["i"] % 2 else 0.0

    with pytest.MonkeyPatch.context():
        groups = await art.gather(agent, range(8), group_size=2, rewards=[one])  # hung for good before
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 16
    store = art.default_store()
    stored = {t.id: t for t in store.trajectories(limit=100)}
    assert set(stored) == {t.id for t in trajs}  # 6 of 16 were stored before
    failed = [t for t in stored.values() if t.scenario["i"] == 5]
    assert len(failed) == 2 and all("no such file: caf\\udce9.txt" == t.error.message for t in failed)
    assert all(ESCAPED in t.warnings for t in failed)
    odd_model = [t for t in stored.values() if t.scenario["i"] == 3]  # the call itself failed: recorded, escaped
    assert {t.calls[0].model for t in odd_model} == {"m-caf\\udce9.txt"}
    assert {t.outcome["path"] for t in stored.values() if t.scenario["i"] == 7} == {"caf\\udce9.txt"}
    clean = [t for t in stored.values() if t.scenario["i"] in (0, 1)]
    assert all(ESCAPED not in t.warnings for t in clean)
    store.save(art.Trajectory(rollout="after"))  # the writer is alive: later writes go through
    assert store.count(rollout="after") == 1


def test_a_rollout_name_with_a_surrogate_is_stored(tmp_path):
    with art.Store(tmp_path / "s.db") as store:
        t = art.Trajectory(rollout=f"agent-{BAD}", metadata={BAD: [BAD]}, warnings=[BAD])
        store.save(t)
        back = store.get(t.id)
        assert back.rollout == "agent-caf\\udce9.txt" and back.metadata == {"caf\\udce9.txt": ["caf\\udce9.txt"]}
        assert ESCAPED in back.warnings and ESCAPED in t.warnings
        store.save(back, replace=True)  # read and saved again: still one warning, not one per save
        assert back.warnings.count(ESCAPED) == 1 and store.get(t.id).warnings.count(ESCAPED) == 1


def test_a_write_that_fails_fails_alone_and_the_writer_goes_on(tmp_path):
    with art.Store(tmp_path / "s.db") as store:
        t = art.Trajectory(rollout="x")
        store.save(t)
        futures = [store.submit(art.Trajectory(rollout="y")) for _ in range(5)]
        dup = store.submit(t)  # already stored: this one fails, the others in its batch do not
        futures += [store.submit(art.Trajectory(rollout="y")) for _ in range(5)]
        for f in futures:
            f.result(30)
        with pytest.raises(art.StoreError, match="already stored"):
            dup.result(30)
        assert store.count(rollout="y") == 10
        unsaved = list((tmp_path / "unsaved").glob("*.json"))
        assert len(unsaved) == 1 and t.id in unsaved[0].read_text()


@pytest.mark.parametrize("where", ["reward", "rewards"])
def test_a_nan_reward_is_refused_by_name_not_stored_as_none(tmp_path, where):
    with art.Store(tmp_path / "s.db") as store:
        t = art.Trajectory(rollout="x", **({"reward": math.nan} if where == "reward" else {"rewards": {"won": math.nan}}))
        with pytest.raises(art.StoreError, match=rf"trajectory {t.id}: {where}.* is nan; rewards must be finite"):
            store.save(t)
        assert store.count() == 0


def _open(path: str, barrier: "multiprocessing.synchronize.Barrier", rounds: int, out: "multiprocessing.Queue") -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import artsdk as art

    failures = []
    for r in range(rounds):
        barrier.wait(60)
        try:
            with art.Store(f"{path}.{r}.db") as store:
                store.save(art.Trajectory(rollout=f"r{r}"))
        except Exception as e:  # noqa: BLE001 - counted
            failures.append(f"{type(e).__name__}: {e}")
    out.put(failures)


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(str(tmp_path / "new"), barrier, 5, out)) for _ in range(4)]
    for p in procs:
        p.start()
    failures = [f for _ in procs for f in out.get(timeout=300)]
    for p in procs:
        p.join(60)
    assert failures == []  # 4 of 20 opens failed with "table art_meta already exists ... corrupt"
    for r in range(5):
        with art.Store(tmp_path / f"new.{r}.db") as store:
            assert store.count() == 4


def test_only_a_file_that_is_not_sqlite_is_called_corrupt(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(art.StoreError, match="not an SQLite database or it is corrupt"):
        art.Store(junk)


WRITER = """
import sys
sys.path.insert(0, {root!r})
import artsdk as art
store = art.Store({path!r})
for i in range({n}):
    group = [art.Trajectory(rollout={tag!r}, scenario={{"i": i, "k": k}}, reward=float(k)) for k in range(4)]
    store.save(group)
    print(" ".join(t.id for t in group), flush=True)
store.close()
"""


def _writer(path, tag: str, n: int):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen([sys.executable, "-c", WRITER.format(root=root, path=str(path), tag=tag, n=n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_writer_killed_mid_commit_leaves_the_store_whole_with_all_it_was_told_is_stored(tmp_path):
    import signal
    import sqlite3
    import time

    path = tmp_path / "s.db"
    art.Store(path).close()
    for round_ in range(3):
        proc = _writer(path, f"k{round_}", 100_000)
        told = []
        deadline = time.monotonic() + 60
        while len(told) < 20 + 15 * round_ and time.monotonic() < deadline:  # killed at a different point each round
            told.append(proc.stdout.readline().split())
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with art.Store(path) as store:
            stored = {t.id for t in store.trajectories(rollout=f"k{round_}")}
        assert {i for ids in told for i in ids} <= stored  # every save that returned is there


def test_two_processes_writing_one_store_lose_nothing(tmp_path):
    path = tmp_path / "s.db"
    art.Store(path).close()
    procs = [_writer(path, tag, 150) for tag in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert not any("locked" in err for _, err in outs)
    with art.Store(path) as store:
        assert store.count(rollout="a") == store.count(rollout="b") == 600
