"""Does `artsdk view` stay responsive on a large store? 100,000 trajectories (of 4 calls, in
groups of 8, over 100 steps) written to an SQLite store, then every JSON endpoint the page
reads timed over HTTP on 127.0.0.1 (median of repeats), next to the same endpoints on a
store of 1,000: the page should cost about the same at either size.

    python -m bench.viewer [--trajectories 100000]

Writes bench/results/viewer.json.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

import artsdk as art
from artsdk.testing import trajectory
from bench.common import save_result


def fill(store: art.Store, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    per_step = max(n // 100, 8)
    batch = []
    for k in range(n):
        step = k // per_step
        msgs = [{"role": "user", "content": f"task {k % per_step}"}]
        for c in range(4):
            msgs = [*msgs, {"role": "assistant", "content": f"answer {c} " * 8}, {"role": "user", "content": "more"}]
        t = trajectory(msgs[:-1], project="big", model="agent", step=step, rollout="agent",
                       rewards={"score": rng.random(), "format": rng.random() * 0.1},
                       token_ids=list(range(24)), logprobs=[-0.5] * 24)
        t.scenario = {"task": k % per_step}
        batch.append(t)
        if len(batch) == 8 * 64:
            groups = [art.Group(trajectories=batch[i:i + 8], scenario=batch[i].scenario, rollout="agent")
                      for i in range(0, len(batch), 8)]
            for g in groups:
                for j, t in enumerate(g.trajectories):
                    t.group_id, t.group_index = g.id, j
            store.save(batch, groups=groups)
            batch = []
    if batch:
        store.save(batch)
    for step in range(n // per_step):
        store.record_step("big", "agent", step + 1, {"loss": 0.1, "clip_fraction": 0.0}, None)


def time_endpoints(url: str, repeats: int) -> dict[str, float]:
    client = httpx.Client(base_url=url + "/api", timeout=60)
    some = client.get("/trajectories", params={"project": "big", "limit": 1}).json()["rows"][0]
    last = client.get("/curve", params={"project": "big", "model": "agent"}).json()["points"][-1]["step"]
    calls = {
        "projects": ("/projects", {}),
        "reward curve": ("/curve", {"project": "big", "model": "agent"}),
        "a step's groups": ("/groups", {"project": "big", "model": "agent", "step": last // 2}),
        "trajectories, first page": ("/trajectories", {"project": "big"}),
        "trajectories, filtered, page 20": ("/trajectories", {"project": "big", "min_step": 10, "max_step": 60,
                                                              "min_reward": 0.5, "offset": 950}),
        "one trajectory": ("/trajectories/" + some["id"], {}),
        "compare two steps": ("/compare", {"project": "big", "model": "agent", "scenario": json.dumps(some["scenario"]),
                                           "a": 0, "b": last}),
    }
    out = {}
    for name, (path, params) in calls.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = client.get(path, params=params)
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
        out[name] = statistics.median(times) * 1e3
    return out


def serve(store: art.Store) -> tuple[str, object]:
    import uvicorn

    from artsdk.viewer.app import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(store), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1_000, a.trajectories):
            store = art.Store(Path(tmp) / f"store{n}.db")
            t0 = time.perf_counter()
            fill(store, n)
            store.flush()
            filled = time.perf_counter() - t0
            url, server = serve(store)
            size = sum(p.stat().st_size for p in Path(tmp).glob(f"store{n}.db*"))  # the file and its WAL
            rows[n] = {"fill_seconds": filled, "ms": time_endpoints(url, a.repeats), "size_mb": size / 1e6}
            server.should_exit = True  # type: ignore[attr-defined]
            print(n, rows[n], flush=True)
            store.close()
    small, big = rows[1_000]["ms"], rows[a.trajectories]["ms"]
    save_result("viewer", {"small": 1_000, "large": a.trajectories, "rows": rows,
                           "ratio": {k: big[k] / small[k] for k in big}})


if __name__ == "__main__":
    main()
