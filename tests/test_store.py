"""The store: round trips, filters, export, groups, failed writes -- on SQLite and on a real
PostgreSQL server -- and SQLite's other processes and bad files."""

import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import artsdk as art
from artsdk.testing import trajectory

pytestmark = pytest.mark.anyio


def multi_turn(n_turns=3, **fields):
    msgs = [{"role": "system", "content": "be brief"}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"q{i}"})
        msgs.append({"role": "assistant", "content": f"a{i}",
                     **({"tool_calls": [{"id": f"c{i}", "type": "function",
                                         "function": {"name": "f", "arguments": "{}"}}]} if i == 0 else {})})
        if i == 0:
            msgs.append({"role": "tool", "tool_call_id": "c0", "content": "result"})
    return trajectory(msgs, token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3], **fields)


def test_round_trip_keeps_everything(tmp_path, store_url):
    store = art.Store(store_url)
    t = multi_turn(outcome={"score": 3, "path": ["a", "b"]}, rewards={"win": 1.0, "len": -0.25},
                   project="p", model="m", step=2, scenario={"seed": 7}, metadata={"k": "v"})
    t.warnings.append("careful")
    store.save(t)
    back = store.get(t.id)
    assert back.model_dump() == t.model_dump()
    # the multi-turn prefix is stored once, not once per call
    import sqlalchemy as sa

    with sa.create_engine(store_url if "://" in store_url else f"sqlite:///{store_url}").connect() as db:
        rows = db.exec_driver_sql("SELECT idx, prefix, messages FROM art_calls ORDER BY idx").fetchall()
    assert [r[1] for r in rows] == [0, 3, 6]
    assert len(json.loads(rows[2][2])) == 1
    store.close()


def test_a_call_with_several_choices_comes_back_with_each_in_index_order(tmp_path, store_url):
    t = multi_turn()
    first = t.calls[1].choices[0]
    other = first.model_copy(update={"index": 1, "message": {"role": "assistant", "content": "other"},
                                     "token_ids": [9], "logprobs": [-0.5]})
    t.calls[1].choices = [other, first]  # written in this order: choice 1's row before choice 0's
    with art.Store(store_url) as store:
        store.save(t)
        for back in (store.get(t.id), store.trajectories()[0]):
            assert [c.index for c in back.calls[1].choices] == [0, 1]
            assert back.calls[1].choices[0].model_dump() == first.model_dump()
            assert back.calls[1].choices[1].model_dump() == other.model_dump()
            # the next call's conversation is rebuilt whole whichever choice came first
            assert back.calls[2].messages == t.calls[2].messages


def test_filters_count_and_prefix_lookup(tmp_path, store_url):
    store = art.Store(store_url)
    ts = []
    for i in range(10):
        t = trajectory([{"role": "user", "content": str(i)}, {"role": "assistant", "content": "x"}],
                       project="p" if i < 8 else "q", model="m", step=i % 3,
                       rewards={"r": i / 10}, error="boom" if i == 9 else None)
        ts.append(t)
    store.save(ts)
    assert store.count() == 10 and store.count(project="p") == 8
    assert [t.reward for t in store.trajectories(min_reward=0.5, max_reward=0.7)] == [0.5, 0.6, 0.7]
    assert {t.step for t in store.trajectories(step=1)} == {1}
    assert [t.id for t in store.trajectories(error=True)] == [ts[9].id]
    assert store.count(error=False) == 9
    assert len(store.trajectories(limit=3, offset=8)) == 2
    assert [t.id for t in store.trajectories(ids=[ts[1].id, ts[3].id])] == [ts[1].id, ts[3].id]
    assert store.trajectories(ids=[]) == []
    assert store.get(ts[4].id[:10]).id == ts[4].id
    with pytest.raises(art.StoreError, match="no trajectory"):
        store.get("f" * 32)
    with pytest.raises(art.StoreError, match="too short"):
        store.get("ab")
    store.close()


def test_each_way_of_reading_brings_each_trajectory_its_own_calls(tmp_path, store_url):
    # all of them (the other tables read whole), more than 500 (looked up by the SELECT as a
    # subquery) and a page (looked up by id): each comes back as it was saved, calls and all
    store = art.Store(store_url)
    saved = [trajectory([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
                        token_ids=[i, i + 1], rewards={"r": i / 100}, project="p" if i < 520 else "q", model="m",
                        step=i % 4) for i in range(540)]
    for i, t in enumerate(saved):
        t.started_at = t.started_at.fromtimestamp(1_700_000_000 + i, t.started_at.tzinfo)
    store.save(saved)
    by_id = {t.id: t.model_dump() for t in saved}
    reads = {"all": store.trajectories(), "over 500": store.trajectories(project="p"),
             "a page": store.trajectories(project="p", newest_first=True, limit=7, offset=3),
             "one step": store.trajectories(project="q", step=2)}
    assert [len(v) for v in reads.values()] == [540, 520, 7, 5]
    assert [t.id for t in reads["a page"]] == [t.id for t in saved[516:509:-1]]
    for label, got in reads.items():
        for t in got:
            assert t.model_dump() == by_id[t.id], label
    store.close()


def test_the_rows_written_name_every_column_of_their_table():
    # the writer inserts row tuples under these names: a column added to a table and not to
    # its rows (or the other way round) fails here, not as a NULL in a user's store
    from artsdk.store.rows import Rows

    for table, columns in Rows.COLUMNS.items():
        assert len(set(columns)) == len(columns), table
        assert set(columns) == set(table.__table__.columns.keys()), table


def test_an_sqlite_that_binds_few_variables_a_statement_still_takes_every_row(tmp_path):
    # builds whose limit on bound variables is low (999 before SQLite 3.32, or set lower at
    # compile time): the writer's multi-row INSERTs take as many rows as the connection allows
    from sqlalchemy import event

    store = art.Store(tmp_path / "s.db")
    event.listen(store._engine, "connect", lambda conn, _: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 40))
    store._engine.dispose()  # the writer's next connection is a new one, with the low limit
    saved = [multi_turn(rewards={"a": 1.0, "b": 0.5}) for _ in range(37)]
    store.save(saved)
    back = {t.id: t.model_dump() for t in store.trajectories()}
    assert back == {t.id: t.model_dump() for t in saved}
    store.close()


def test_export_jsonl_and_iterate(tmp_path, store_url):
    store = art.Store(store_url)
    store.save([multi_turn(project="p") for _ in range(5)])
    n = store.export_jsonl(tmp_path / "out.jsonl", project="p")
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert n == 5 == len(lines)
    first = art.Trajectory.model_validate_json(lines[0])
    assert len(first.calls) == 3 and first.calls[2].choices[0].token_ids == [5, 6, 7]
    assert len(list(store.iter_trajectories(batch=2))) == 5
    store.close()


async def test_groups_come_back_for_training(tmp_path, server, store_url):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url, api_key="k")

    @art.rollout
    async def agent(q: str):
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.reward
    def length(t):
        return float(len(t.outcome))

    store = art.Store(store_url)
    groups = await art.gather(agent, ["a", "bbb"], group_size=3, rewards=[length], store=store)
    loaded = {g.id: g for g in store.groups()}
    assert set(loaded) == {g.id for g in groups}
    for g in groups:  # same members in the same order
        assert [t.id for t in loaded[g.id]] == [t.id for t in g]
    b = loaded[groups[1].id]
    assert b.scenario == "bbb" and b.rewards == [9.0] * 3 and b.no_signal
    assert all(c.trainable for g in loaded.values() for t in g for _, c in t.choices())
    await client.close()
    store.close()


def test_store_reopened_by_a_second_process(tmp_path):
    path = tmp_path / "shared.db"
    store = art.Store(path)
    mine = multi_turn(project="p")
    store.save(mine)
    script = textwrap.dedent(f"""
        import artsdk as art
        from artsdk.testing import trajectory
        s = art.Store({str(path)!r})
        got = s.get({mine.id!r})
        assert got.calls[2].messages[-1]["content"] == "q2", got
        t = trajectory([{{"role": "user", "content": "from child"}},
                        {{"role": "assistant", "content": "ok"}}], project="child")
        s.save(t)
        print(t.id)
        s.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    child_id = out.stdout.strip().splitlines()[-1]
    assert store.get(child_id).calls[0].messages[0]["content"] == "from child"
    assert store.count() == 2
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_corrupt_foreign_and_unopenable_stores_are_refused_untouched(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(art.StoreError, match="not an SQLite database or it is corrupt"):
        art.Store(corrupt)
    assert corrupt.read_bytes() == b"this is not a database" * 100

    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada')")
    before = foreign.read_bytes()
    with pytest.raises(art.StoreError, match="another application .*users.*allow_foreign"):
        art.Store(foreign)
    assert foreign.read_bytes() == before
    art.Store(foreign, allow_foreign=True).close()
    with sqlite3.connect(foreign) as db:
        assert db.execute("SELECT name FROM users").fetchall() == [("ada",)]

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(art.StoreError, match="cannot create the folder"):
        art.Store(blocker / "sub" / "s.db")
    with pytest.raises(art.StoreError, match="Install the database driver"):
        art.Store("nosuchdb://host/db")


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "s.db"
    art.Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE art_meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(art.StoreError, match="newer artsdk"):
        art.Store(path)


def test_duplicate_write_fails_alone_and_is_saved_aside(tmp_path, store_url):
    store = art.Store(store_url)
    t = multi_turn()
    store.save(t)
    others = [multi_turn() for _ in range(3)]
    futures = [store.submit(t)] + [store.submit(o) for o in others]
    with pytest.raises(art.StoreError, match=f"could not store trajectory {t.id}.*saved to"):
        futures[0].result()
    for f in futures[1:]:
        f.result()  # the good ones in the same batch were written
    assert store.count() == 4
    saved = list(tmp_path.rglob("unsaved/*.json"))
    assert len(saved) == 1 and t.id in saved[0].read_text()
    t.reward = 5.0
    store.save(t, replace=True)
    assert store.get(t.id).reward == 5.0 and store.count() == 4
    store.close()


async def test_writes_do_not_block_the_event_loop(tmp_path, store_url):
    import anyio

    store = art.Store(store_url)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    batch = [multi_turn() for _ in range(300)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await store.asave(batch)
        tg.cancel_scope.cancel()
    assert store.count() == 300
    assert ticks >= 2  # the loop kept running while the writer thread committed
    store.close()


def test_unknown_url_scheme_and_default_location(tmp_path):
    art.configure(home=str(tmp_path / "h"))
    s = art.default_store()
    assert s.path == tmp_path / "h" / "store.db"
    with pytest.raises(art.StoreError, match="not a valid SQLAlchemy URL"):
        art.Store("://nothing")


def test_a_waiter_that_gives_up_does_not_end_the_writer(tmp_path):
    """Ctrl-C cancels the task awaiting a write, and with it the write's future: the write
    is still committed and the writer goes on (it used to die on setting a cancelled future)."""
    import threading

    from artsdk.store.writer import Job, Writer

    gate, written = threading.Event(), []

    class Begin:
        def __enter__(self):
            gate.wait(10)
            return None

        def __exit__(self, *exc):
            return False

    writer = Writer(Begin, lambda conn, jobs: written.extend(j.describe for j in jobs), tmp_path, "t")
    first = writer.submit(Job([], "first"))
    assert first.cancel()  # its waiter gave up while the write waited for the database
    gate.set()
    writer.submit(Job([], "second")).result(10)  # the writer lived on
    assert written == ["first", "second"]
    writer.close()


def test_a_store_written_before_runs_opens_and_keeps_everything(tmp_path):
    """tests/data/store_v1.db was written by artsdk before runs (schema 1): it is brought to
    schema 2 in place, with nothing lost, its steps and checkpoints under the run ""."""
    import shutil

    from pathlib import Path

    path = tmp_path / "old.db"
    shutil.copy(Path(__file__).parent / "data" / "store_v1.db", path)
    with art.Store(path) as store:
        old = store.trajectories(project="old")
        assert len(old) == 3 and {t.run for t in old} == {None} and sorted(t.reward for t in old) == [0.0, 0.5, 1.0]
        assert [s["step"] for s in store.steps("old", "agent")] == [1, 2]  # the run "" of before
        assert [c["path"] for c in store.checkpoints("old", "agent", run="")] == ["/ckpt/1", "/ckpt/2"]
        assert [g.scenario for g in store.groups(project="old")] == [{"x": 1}]
        store.record_run("old", "agent", "second", base_model="tiny")
        store.record_step("old", "agent", 1, {"loss": 0.1}, run="second")  # step 1 again, in another run
        assert [s["metrics"]["loss"] for s in store.steps("old", "agent")] == [0.1]
        assert [s["metrics"]["loss"] for s in store.steps("old", "agent", run="")] == [0.5, 0.25]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM art_meta").fetchone() == ("2",)
    with art.Store(path) as store:  # opened again: nothing to do
        assert store.count() == 3


@pytest.mark.skipif(not __import__("importlib").util.find_spec("pgserver"), reason="pgserver is not installed")
async def test_postgres_restarted_mid_run_loses_nothing(postgres, postgres_url, caplog):
    """Trajectories keep coming while the PostgreSQL server stops and starts again: the writes
    made while it was down wait and are stored once it is back; none is lost or doubled."""
    import threading

    import pgserver

    store = art.Store(postgres_url)
    sent, futures = [], []
    stop = threading.Event()

    def produce():
        while not stop.is_set():
            t = multi_turn(project="pg")
            sent.append(t.id)
            futures.append(store.submit(t))
            stop.wait(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    import anyio

    await anyio.sleep(0.5)
    pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=postgres.pgdata, user=postgres.system_user)
    await anyio.sleep(2.0)  # rollouts go on finishing while the server is down
    down = len(sent)
    postgres.ensure_postgres_running()
    await anyio.sleep(0.5)
    stop.set()
    producer.join()
    for f in futures:
        f.result(timeout=120)  # every write settles without an error
    assert store.count(project="pg") == len(sent) and len(set(sent)) == len(sent) > down > 20
    assert {t.id for t in store.trajectories(project="pg", limit=10_000)} == set(sent)
    assert "the store cannot be reached" in caplog.text and "reachable again" in caplog.text
    store.close()


@pytest.mark.parametrize("filters", [{"project": "p"}, {"project": "p", "model": "m"},
                                     {"project": "p", "model": "m", "run": "r"}])
def test_newest_first_pages_are_read_by_an_index_not_a_sort(tmp_path, filters):
    """The viewer's and the CLI's newest-first page walks an index in order: no sort of every
    matching row (a 100,000-trajectory store: bench.store)."""
    import sqlalchemy as sa

    from artsdk.store import tables as T
    from artsdk.store.query import select_trajectories

    with art.Store(tmp_path / "s.db") as store:
        t = T.TrajectoryRow.__table__
        q = select_trajectories(**filters).order_by(t.c.started_at.desc(), t.c.id).limit(50)
        sql = str(q.compile(store._engine, compile_kwargs={"literal_binds": True}))
        with store._engine.connect() as conn:
            plan = " | ".join(str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql)))
    assert "ix_art_traj_p" in plan and "started" in plan, plan
    assert "TEMP B-TREE FOR ORDER BY" not in plan, plan  # sorted every match before
