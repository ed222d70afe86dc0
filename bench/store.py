"""Store throughput: write and read back 10,000 trajectories of 10 messages, next to raw
``sqlite3`` doing the same into the same schema (the limit).

    python -m bench.store [--n 10000] [--page 100000] [--runs 3]

"artsdk" starts from Trajectory objects and ends with them committed (write), or starts
from the file and ends with Trajectory objects (read). "raw sqlite3" starts from the same
objects too: it makes their rows with the function artsdk makes them with (the same
serializer: the JSON columns cost both sides alike) and inserts them with ``executemany`` in
one transaction, on the calling thread, checking nothing (write). Beside it, the SQL alone:
the same rows handed over already made, only inserted (what no writer starting from
trajectories can reach). A raw read fetches the rows and decodes their JSON columns with the
json module, building no objects. Then the newest page of one project in a store of 100,000
trajectories. Each timed part starts from a collected heap (``gc.collect()``), so neither pays
for the other's garbage. Writes bench/results/store.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sqlite3
import tempfile
import time
from pathlib import Path

import artsdk as art
from bench.common import save_result
from artsdk.store.rows import (CALL_COLUMNS, CHOICE_COLUMNS, JSON_COLUMNS, REWARD_COLUMNS, TRAJECTORY_COLUMNS,
                               trajectory_rows)
from artsdk.testing import trajectory

TABLES = (("art_trajectories", 0), ("art_calls", 1), ("art_choices", 2), ("art_rewards", 3))
COLUMNS = (TRAJECTORY_COLUMNS, CALL_COLUMNS, CHOICE_COLUMNS, REWARD_COLUMNS)


def make(n: int) -> list[art.Trajectory]:
    """Trajectories of 10 messages: 9 of request context and the sampled answer, with its
    token ids and logprobs (what a training run stores)."""
    out = []
    for i in range(n):
        msgs = [
            {"role": "system", "content": "You play tic-tac-toe as X. Answer with a cell."},
            {"role": "user", "content": f"game {i}: new board, you start"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "show_board", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": ". . . / . . . / . . ."},
        ]
        for k in range(2):
            msgs.append({"role": "user", "content": f"board {i} turn {k}: . X O / . . X / O . ."})
            msgs.append({"role": "assistant", "content": f"B{k}"})
        msgs.append({"role": "user", "content": "your move"})
        t = trajectory(calls=[msgs + [{"role": "assistant", "content": "C3"}]], project="bench",
                       model="agent", step=i % 5, rollout="play", outcome={"winner": "x"},
                       rewards={"won": 1.0, "moves": 0.25})
        t.calls = t.calls[-1:]
        t.calls[0].index = 0
        t.calls[0].choices[0].token_ids = [34, 18]
        t.calls[0].choices[0].logprobs = [-0.12, -0.05]
        out.append(t)
    return out


def bench_artsdk(trajs: list[art.Trajectory], folder: Path, group: int) -> tuple[float, float]:
    store = art.Store(folder / "artsdk.db")
    gc.collect()  # neither side pays for garbage the other (or make()) left
    t0 = time.perf_counter()
    # as gather does: one submission per group, all in flight at once
    futures = [store.submit(trajs[i:i + group]) for i in range(0, len(trajs), group)]
    for f in futures:
        f.result()
    write = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    back = store.trajectories()
    read = time.perf_counter() - t0
    assert len(back) == len(trajs) and back[0].calls[0].choices[0].token_ids == [34, 18]
    assert len(back[0].calls[0].messages) == 9
    store.close()
    return write, read


def raw_rows(trajs: list[art.Trajectory]) -> list[list[tuple]]:
    """The four tables' rows of ``trajs``, made by the function artsdk makes them with (so
    both sides serialise alike)."""
    rows: list[list[tuple]] = [[], [], [], []]
    for t in trajs:
        row, calls, choices, rewards = trajectory_rows(t)
        rows[0].append(row)
        for k, part in ((1, calls), (2, choices), (3, rewards)):
            rows[k].extend(part)
    return rows


def raw_db(path: Path) -> sqlite3.Connection:
    # same schema: let artsdk create the empty tables, then write with sqlite3 directly
    art.Store(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def raw_insert(db: sqlite3.Connection, rows: list[list[tuple]]) -> None:
    with db:
        for (table, k) in TABLES:
            cols = COLUMNS[k]
            db.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                           f"({', '.join('?' * len(cols))})", rows[k])


def bench_raw(trajs: list[art.Trajectory], folder: Path) -> dict[str, float]:
    """Seconds for raw sqlite3 to write ``trajs`` from the objects (``write``: their rows
    made, then inserted in one transaction), to insert the same rows handed over already made
    (``sql``), and to read them back (``read``)."""
    db = raw_db(folder / "raw_objects.db")
    gc.collect()
    t0 = time.perf_counter()
    raw_insert(db, raw_rows(trajs))
    write = time.perf_counter() - t0
    db.close()
    rows = raw_rows(trajs)
    db = raw_db(folder / "raw.db")
    gc.collect()
    t0 = time.perf_counter()
    raw_insert(db, rows)
    sql = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    for table, _ in TABLES:
        cur = db.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        as_json = [i for i, n in enumerate(names) if n in JSON_COLUMNS]
        for row in cur.fetchall():
            [json.loads(row[i]) for i in as_json if row[i] is not None]
    read = time.perf_counter() - t0
    db.close()
    return {"write": write, "sql": sql, "read": read}


def newest_page(folder: Path, n: int, repeat: int = 20) -> dict[str, float]:
    """A store of ``n`` trajectories over 10 projects: the newest 50 of one project, through
    ``Store.trajectories`` (median seconds) beside the same SELECT in raw sqlite3."""
    path = folder / "page.db"
    store = art.Store(path)
    base = make(1)[0]
    for start in range(0, n, 5000):
        batch = []
        for i in range(start, min(n, start + 5000)):
            t = base.model_copy(deep=True, update={"id": f"{i:032d}", "project": f"p{i % 10}"})
            t.started_at = t.started_at.fromtimestamp(1_700_000_000 + i, t.started_at.tzinfo)
            batch.append(t)
        store.save(batch)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        page = store.trajectories(project="p3", newest_first=True, limit=50)
        times.append(time.perf_counter() - t0)
    assert len(page) == 50 and page[0].id == f"{n - 7:032d}"
    store.close()
    db = sqlite3.connect(path)
    raw = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        db.execute("SELECT * FROM art_trajectories WHERE project = ? ORDER BY started_at DESC, id LIMIT 50",
                   ("p3",)).fetchall()
        raw.append(time.perf_counter() - t0)
    db.close()
    return {"page_trajectories": n, "newest_page_s": sorted(times)[repeat // 2], "raw_page_s": sorted(raw)[repeat // 2]}


def one_run(trajs: list[art.Trajectory], n: int, group: int, repeat: int) -> dict[str, float]:
    """Write and read with artsdk and raw sqlite3 in turn, ``repeat`` times; the best of each."""
    best = {"artsdk_write": 1e9, "artsdk_read": 1e9, "raw_write": 1e9, "raw_sql": 1e9, "raw_read": 1e9}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            w, r = bench_artsdk(trajs, Path(d), group)
            raw = bench_raw(trajs, Path(d))
        for k, v in {"artsdk_write": w, "artsdk_read": r, **{f"raw_{k}": v for k, v in raw.items()}}.items():
            best[k] = min(best[k], v)
    return {"trajectories": n, "messages_each": 10,
            **{f"{k}_per_s": n / v for k, v in best.items()},
            "write_ratio": best["raw_write"] / best["artsdk_write"],
            "sql_ratio": best["raw_sql"] / best["artsdk_write"],
            "read_ratio": best["raw_read"] / best["artsdk_read"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--page", type=int, default=100_000, help="trajectories in the store the newest page is read from")
    ap.add_argument("--runs", type=int, default=3, help="whole measurements (each the best of --repeat): their spread")
    a = ap.parse_args()
    trajs = make(a.n)
    runs = [one_run(trajs, a.n, a.group, a.repeat) for _ in range(a.runs)]
    # each row's figures from its median run (by that row's ratio): the write's and the read's may differ
    kinds = {"write": ("artsdk_write_per_s", "raw_write_per_s", "write_ratio"),
             "sql": ("raw_sql_per_s", "sql_ratio"), "read": ("artsdk_read_per_s", "raw_read_per_s", "read_ratio")}
    result: dict = {"trajectories": a.n, "messages_each": 10}
    for kind, keys in kinds.items():
        mid = sorted(runs, key=lambda r: r[f"{kind}_ratio"])[len(runs) // 2]
        result.update({k: mid[k] for k in keys})
        if kind == "sql":  # artsdk's write in that run, beside it
            result["sql_artsdk_write_per_s"] = mid["artsdk_write_per_s"]
    result["runs"] = [{f"{k}_ratio": r[f"{k}_ratio"] for k in kinds} for r in runs]
    with tempfile.TemporaryDirectory() as d:
        result.update(newest_page(Path(d), a.page))
    save_result("store", result)
    each = {k: ", ".join(f"{r[k]:.2f}" for r in result["runs"]) for k in ("write_ratio", "sql_ratio", "read_ratio")}
    print(f"write: artsdk {result['artsdk_write_per_s']:,.0f} traj/s, raw sqlite3 "
          f"{result['raw_write_per_s']:,.0f} traj/s, ratio {result['write_ratio']:.2f} (runs: {each['write_ratio']})")
    print(f"       artsdk {result['sql_artsdk_write_per_s']:,.0f} traj/s, raw sqlite3 inserting the rows made "
          f"beforehand {result['raw_sql_per_s']:,.0f} traj/s, "
          f"ratio {result['sql_ratio']:.2f} (runs: {each['sql_ratio']})")
    print(f"read:  artsdk {result['artsdk_read_per_s']:,.0f} traj/s, raw sqlite3 "
          f"{result['raw_read_per_s']:,.0f} traj/s, ratio {result['read_ratio']:.2f} (runs: {each['read_ratio']})")
    print(f"newest 50 of one project in {a.page:,} trajectories: {result['newest_page_s'] * 1000:.1f} ms "
          f"(the SELECT alone in sqlite3: {result['raw_page_s'] * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
