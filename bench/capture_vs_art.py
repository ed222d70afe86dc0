"""Capture overhead beside OpenPipe ART's, in one run: the same chat-completion calls (plain and
streamed) to one loopback server, each system with and without its capture, in alternating
rounds so that machine noise hits all four alike.

    python3.11 -m venv .venv-art && .venv-art/bin/pip install openpipe-art==0.5.18 "openai==2.54.*"
    python -m bench.capture_vs_art [--art-python .venv-art/bin/python] [--rounds 30 --block 40 --runs 3]

Each captured call is one rollout of one call: ``@art.rollout`` here, ART's
``AutoTrajectoryContext`` (what ``capture_auto_trajectory`` opens) in its own venv
(bench/art_worker.py), each client from its own environment. A system's overhead is the median
over rounds of (captured - uncaptured) seconds per call; the ratio is artsdk's over ART's, one
per run, reported with their mean and spread. The clients run on one CPU, the server on the
other. Writes bench/results/capture_vs_art.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import artsdk as art
from artsdk import capture
from bench.capture import MSGS, start_server
from bench.common import save_result
from openai import OpenAI

HERE = Path(__file__).resolve().parent


def ours(client: OpenAI, captured: bool, stream: bool, n: int) -> float:
    def call() -> None:
        out = client.chat.completions.create(model="m", messages=MSGS, stream=stream)
        if stream:
            for _ in out:
                pass

    one = art.rollout(name="bench")(call)  # a plain call of a rollout: recorded, not stored
    (capture.install if captured else capture.uninstall)()
    t0 = time.perf_counter()
    for _ in range(n):
        (one if captured else call)()
    return (time.perf_counter() - t0) / n


class ArtWorker:
    """bench/art_worker.py in ART's venv, driven one block at a time."""

    def __init__(self, python: str, url: str, cpu: int | None) -> None:
        self.proc = subprocess.Popen([python, str(HERE / "art_worker.py"), url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=HERE.parent.parent,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
        self.versions = json.loads(self.proc.stdout.readline())

    def block(self, captured: bool, stream: bool, n: int) -> float:
        self.proc.stdin.write(json.dumps({"captured": captured, "stream": stream, "n": n}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"ART's worker ended (exit {self.proc.wait()}); its error is above")
        return json.loads(line)["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def one_run(url: str, worker: ArtWorker, rounds: int, block: int) -> list[dict[str, Any]]:
    client = OpenAI(base_url=url, api_key="k", max_retries=0)
    rows = []
    for stream in (False, True):
        times: dict[str, list[float]] = {k: [] for k in ("ours_plain", "ours_captured", "art_plain", "art_captured")}
        for r in range(rounds):
            order = [("ours", False), ("ours", True), ("art", False), ("art", True)]
            for who, captured in (order if r % 2 == 0 else order[::-1]):  # neither always goes first
                n = block // 2 if stream else block
                t = ours(client, captured, stream, n) if who == "ours" else worker.block(captured, stream, n)
                times[f"{who}_{'captured' if captured else 'plain'}"].append(t)
        over = {who: [c - p for p, c in zip(times[f"{who}_plain"], times[f"{who}_captured"])]
                for who in ("ours", "art")}
        o, a = statistics.median(over["ours"]), statistics.median(over["art"])
        rows.append({"case": "streamed" if stream else "plain", "rounds": rounds,
                     "ours_uncaptured_ms": statistics.median(times["ours_plain"]) * 1e3,
                     "art_uncaptured_ms": statistics.median(times["art_plain"]) * 1e3,
                     "ours_overhead_us": o * 1e6, "art_overhead_us": a * 1e6, "ratio": o / a})
    capture.install()
    client.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--art-python", default=os.environ.get("ARTSDK_ART_PYTHON", ".venv-art/bin/python"),
                    help="the Python of a venv with openpipe-art (and its openai client) installed")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=40, help="calls per block (half as many streamed)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not Path(a.art_python).exists():
        raise SystemExit(f"no Python at {a.art_python}: make ART's venv first (see this file's docstring) or name "
                         f"its python with --art-python")
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = cpus[0] if len(cpus) > 1 else None
    proc, url = start_server()  # the server is free to run on any CPU; the clients share one
    if client_cpu is not None:
        os.sched_setaffinity(proc.pid, set(cpus[1:]))
        os.sched_setaffinity(0, {client_cpu})
    worker = ArtWorker(a.art_python, url, client_cpu)
    try:
        runs = [one_run(url, worker, a.rounds, a.block) for _ in range(a.runs)]
    finally:
        worker.close()
        proc.terminate()
        proc.wait(10)
    summary = []
    for i, case in enumerate(("plain", "streamed")):
        ratios = [run[i]["ratio"] for run in runs]
        summary.append({"case": case, "ratios": ratios, "mean_ratio": statistics.mean(ratios),
                        "sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
                        "ours_overhead_us": statistics.mean(run[i]["ours_overhead_us"] for run in runs),
                        "art_overhead_us": statistics.mean(run[i]["art_overhead_us"] for run in runs)})
    save_result("capture_vs_art", {"cpu_count": os.cpu_count(), "art": worker.versions,
                                   "openai": __import__("openai").__version__, "rounds": a.rounds,
                                   "block": a.block, "runs": runs, "summary": summary})
    for s in summary:
        print(f"{s['case']:9} artsdk +{s['ours_overhead_us']:.0f} us/call, ART +{s['art_overhead_us']:.0f} us/call: "
              f"ratio {s['mean_ratio']:.2f} ± {s['sd']:.2f} (runs: {', '.join(f'{r:.2f}' for r in s['ratios'])})")


if __name__ == "__main__":
    main()
