"""Capture overhead beside OpenPipe ART's, in one run: the same chat-completion calls (plain and
streamed) to one loopback server, each system with and without its capture, each system's calls
made by a worker process of its own (bench/ours_worker.py here, bench/art_worker.py in ART's
venv), started afresh for every run, so that the runs also sample what differs between one
process and the next.

Three ways of timing them:

- ``paired`` (the headline): each captured call is timed right beside an uncaptured one
  (bench/paired.py; which goes first alternates), in wall time and in the process's CPU time; a
  system's overhead is the median of those differences over the run. Both systems' patches are
  in place throughout, as in a program that imported them; an uncaptured call is one made
  outside a capture scope (outside a rollout; outside an ``AutoTrajectoryContext``).
- ``installed``: the same calls timed a block at a time, captured blocks and uncaptured blocks
  alternating; a system's overhead is the median over rounds of (captured - uncaptured) seconds
  per call. The machine's drift between blocks lands in every difference: its runs spread
  several times wider.
- ``toggled`` (not run unless asked for): as ``installed``, with the patches taken out for each
  uncaptured block and put back for each captured one (what this bench measured first). Changing
  a class's methods every block throws away the interpreter's specialised caches for the code
  that uses those classes, and both systems pay for that again in every block.

    python3.11 -m venv .venv-art && .venv-art/bin/pip install openpipe-art==0.5.18 "openai==2.54.*"
    python -m bench.capture_vs_art [--art-python .venv-art/bin/python] [--runs 6 --methods paired,installed]
    python -m bench.capture_vs_art --instructions   # the same calls, counted in instructions (valgrind)

``--instructions`` runs both systems' workers under valgrind's callgrind and counts the machine
instructions of each block of calls instead, which no neighbour changes (installed patches).
Instructions are not time -- code that runs cold costs more per instruction -- but they are what
each system's capture asks of the CPU.

Each captured call is one rollout of one call: ``@art.rollout`` here, ART's
``AutoTrajectoryContext`` (what ``capture_auto_trajectory`` opens), each client from its own
environment. The ratio is artsdk's overhead over ART's, one per run, reported with their mean
and spread. The workers run on one CPU, the server on the other. Writes
bench/results/capture_vs_art.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import artsdk as art
from artsdk import capture
from bench.capture import one_call, start_server
from bench.common import save_result
from bench.paired import pairs
from openai import OpenAI

HERE = Path(__file__).resolve().parent


def ours(client: OpenAI, captured: bool, stream: bool, n: int, toggle: bool, counted: bool = False) -> float:
    """Seconds per call of ``n`` of artsdk's calls (here, and in bench/ours_worker.py); ``counted``:
    inside one ``functools.reduce``, what ``--instructions`` counts."""
    call = functools.partial(one_call, client, stream)
    one = art.rollout(name="bench")(call)  # a plain call of a rollout: recorded, not stored
    (capture.install if captured or not toggle else capture.uninstall)()
    f = one if captured else call
    t0 = time.perf_counter()
    if counted:
        functools.reduce(lambda *_: f(), range(n), None)
    else:
        for _ in range(n):
            f()
    return (time.perf_counter() - t0) / n


def ours_paired(client: OpenAI, stream: bool, n: int) -> dict[str, list[float]]:
    """``n`` pairs of one uncaptured and one captured call of artsdk's (bench/paired.py), the
    patches in place."""
    call = functools.partial(one_call, client, stream)
    capture.install()
    return pairs(call, art.rollout(name="bench")(call), n)


class Worker:
    """bench/art_worker.py in ART's venv (or bench/ours_worker.py: the same protocol), driven one
    block at a time; ``under``: a command to run it under (valgrind)."""

    def __init__(self, python: str, url: str, cpu: int | None, script: str = "art_worker.py",
                 under: tuple[str, ...] = ()) -> None:
        # the worker runs outside the checkout (it must not import this artsdk): a relative
        # --art-python is taken from here, not from there
        python = os.path.abspath(python) if os.sep in python else python
        self.proc = subprocess.Popen([*under, python, str(HERE / script), url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=HERE.parent.parent,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
        self.versions = json.loads(self.proc.stdout.readline())

    def block(self, captured: bool, stream: bool, n: int, toggle: bool, counted: bool = False) -> float:
        return self._ask({"captured": captured, "stream": stream, "n": n, "toggle": toggle,
                          "counted": counted})["seconds"]

    def paired(self, stream: bool, n: int) -> dict[str, list[float]]:
        return self._ask({"paired": True, "stream": stream, "n": n})

    def _ask(self, command: dict[str, Any]) -> Any:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended (exit {self.proc.wait()}); its error is above")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def one_run(workers: dict[str, Worker], rounds: int, block: int, methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """One run: ``workers`` are each system's (fresh processes, so that the runs also sample what
    differs between one process and the next: memory layout, hash seeds)."""
    rows = []
    if "paired" in methods:
        rows += paired_rows(workers, rounds, block)
    for method in (m for m in ("installed", "toggled") if m in methods):
        toggle = method == "toggled"
        for stream in (False, True):
            times: dict[str, list[float]] = {k: [] for k in ("ours_plain", "ours_captured", "art_plain", "art_captured")}
            for r in range(rounds):
                order = [("ours", False), ("ours", True), ("art", False), ("art", True)]
                for who, captured in (order if r % 2 == 0 else order[::-1]):  # neither always goes first
                    n = block // 2 if stream else block
                    times[f"{who}_{'captured' if captured else 'plain'}"].append(
                        workers[who].block(captured, stream, n, toggle))
            over = {who: [c - p for p, c in zip(times[f"{who}_plain"], times[f"{who}_captured"])]
                    for who in ("ours", "art")}
            o, a = statistics.median(over["ours"]), statistics.median(over["art"])
            rows.append({"method": method, "case": "streamed" if stream else "plain", "rounds": rounds,
                         "ours_uncaptured_ms": statistics.median(times["ours_plain"]) * 1e3,
                         "art_uncaptured_ms": statistics.median(times["art_plain"]) * 1e3,
                         "ours_overhead_us": o * 1e6, "art_overhead_us": a * 1e6, "ratio": o / a})
    return rows


def paired_rows(workers: dict[str, Worker], rounds: int, block: int) -> list[dict[str, Any]]:
    """The headline: each system's overhead as the median, over every pair of the run, of a
    captured call's time minus the uncaptured call's made right beside it (bench/paired.py), in
    wall time and in CPU time; the systems take turns a round at a time."""
    rows = []
    for stream in (False, True):
        n = block // 2 if stream else block
        diffs: dict[str, dict[str, list[float]]] = {who: {"wall": [], "cpu": []} for who in ("ours", "art")}
        for r in range(rounds):
            for who in (("ours", "art") if r % 2 == 0 else ("art", "ours")):
                got = workers[who].paired(stream, n)
                for clock in ("wall", "cpu"):
                    diffs[who][clock] += got[clock]
        med = {who: {clock: statistics.median(d[clock]) for clock in d} for who, d in diffs.items()}
        rows.append({"method": "paired", "case": "streamed" if stream else "plain", "rounds": rounds,
                     "pairs": rounds * n, "ours_overhead_us": med["ours"]["wall"] * 1e6,
                     "art_overhead_us": med["art"]["wall"] * 1e6, "ratio": med["ours"]["wall"] / med["art"]["wall"],
                     "ours_cpu_us": med["ours"]["cpu"] * 1e6, "art_cpu_us": med["art"]["cpu"] * 1e6,
                     "cpu_ratio": med["ours"]["cpu"] / med["art"]["cpu"]})
    return rows


def counted(python: str, script: str, url: str, captured: bool, stream: bool, n: int) -> float:
    """Instructions per call of ``n`` calls of one worker (its own process, run under callgrind).
    Only what runs inside the block's ``functools.reduce`` is counted (``--toggle-collect``),
    so start-up, warm-up and the protocol around the block are not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="capture-instructions-") as d:
        out = Path(d) / "cg.out"
        under = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                 "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}")
        w = Worker(python, url, None, script, under)
        try:
            subprocess.run(["callgrind_control", "-i", "on", str(w.proc.pid)], check=True, capture_output=True)
            for _ in range(3):  # warm: the first calls import and build what later ones reuse
                w.block(captured, stream, n, False)
            w.block(captured, stream, n, False, counted=True)
        finally:
            w.close()
        totals = next(line for line in out.read_text().splitlines() if line.startswith("totals:"))
    return int(totals.split()[1]) / n


def instructions(a: argparse.Namespace, url: str) -> None:
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    pythons = {"ours": (sys.executable, "ours_worker.py"), "art": (a.art_python, "art_worker.py")}
    jobs = [(who, stream, captured) for stream in (False, True) for who in pythons for captured in (False, True)
            for _ in range(a.repeats)]
    with ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0)) - 1)) as pool:
        counts = list(pool.map(lambda j: counted(*pythons[j[0]], url, j[2], j[1], 10 if j[1] else 20), jobs))
    rows = []
    for stream in (False, True):
        per = {who: {kind: [c for (w, s, cap), c in zip(jobs, counts) if (w, s, cap) == (who, stream, kind == "captured")]
                     for kind in ("plain", "captured")} for who in pythons}
        over = {who: statistics.median(p["captured"]) - statistics.median(p["plain"]) for who, p in per.items()}
        rows.append({"case": "streamed" if stream else "plain", "calls": 10 if stream else 20, "repeats": a.repeats,
                     "ours_uncaptured": statistics.median(per["ours"]["plain"]),
                     "art_uncaptured": statistics.median(per["art"]["plain"]),
                     "ours_overhead": over["ours"], "art_overhead": over["art"], "ratio": over["ours"] / over["art"],
                     "each": per})
        print(f"{rows[-1]['case']:9} artsdk +{over['ours']:,.0f} instructions/call (of {rows[-1]['ours_uncaptured']:,.0f}), "
              f"ART +{over['art']:,.0f} (of {rows[-1]['art_uncaptured']:,.0f}): ratio {rows[-1]['ratio']:.2f}")
    save_result("capture_vs_art_instructions", {"rows": rows})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--art-python", default=os.environ.get("ARTSDK_ART_PYTHON", ".venv-art/bin/python"),
                    help="the Python of a venv with openpipe-art (and its openai client) installed")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=40, help="calls per block (half as many streamed)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", default="paired,installed",
                    help="comma-separated, of paired (the headline), installed, toggled (see this file's docstring)")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions under valgrind instead of timing (see this file's docstring)")
    ap.add_argument("--repeats", type=int, default=2, help="with --instructions: processes of each kind")
    a = ap.parse_args()
    if not Path(a.art_python).exists():
        raise SystemExit(f"no Python at {a.art_python}: make ART's venv first (see this file's docstring) or name "
                         f"its python with --art-python")
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = cpus[0] if len(cpus) > 1 else None
    proc, url = start_server()  # the server is free to run on any CPU; the clients share one
    if a.instructions:
        try:
            return instructions(a, url)
        finally:
            proc.terminate()
            proc.wait(10)
    if client_cpu is not None:
        os.sched_setaffinity(proc.pid, set(cpus[1:]))
        os.sched_setaffinity(0, {client_cpu})
    methods = tuple(a.methods.split(","))
    runs, versions = [], {}
    try:
        for _ in range(a.runs):
            workers = {"ours": Worker(sys.executable, url, client_cpu, "ours_worker.py"),
                       "art": Worker(a.art_python, url, client_cpu)}
            try:
                for w in workers.values():  # warm: the first calls import and build what later ones reuse
                    w.paired(False, 20)
                    w.paired(True, 10)
                runs.append(one_run(workers, a.rounds, a.block, methods))
                versions = workers["art"].versions
            finally:
                for w in workers.values():
                    w.close()
    finally:
        proc.terminate()
        proc.wait(10)
    summary = []
    for i, row in enumerate(runs[0]):
        ratios = [run[i]["ratio"] for run in runs]
        summary.append({"method": row["method"], "case": row["case"], "ratios": ratios,
                        "mean_ratio": statistics.mean(ratios),
                        "sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
                        "ours_overhead_us": statistics.mean(run[i]["ours_overhead_us"] for run in runs),
                        "art_overhead_us": statistics.mean(run[i]["art_overhead_us"] for run in runs)})
        if "cpu_ratio" in row:
            cpu = [run[i]["cpu_ratio"] for run in runs]
            summary[-1].update(cpu_ratios=cpu, mean_cpu_ratio=statistics.mean(cpu),
                               cpu_sd=statistics.stdev(cpu) if len(cpu) > 1 else 0.0,
                               ours_cpu_us=statistics.mean(run[i]["ours_cpu_us"] for run in runs),
                               art_cpu_us=statistics.mean(run[i]["art_cpu_us"] for run in runs))
    save_result("capture_vs_art", {"cpu_count": os.cpu_count(), "art": versions,
                                   "openai": __import__("openai").__version__, "rounds": a.rounds,
                                   "block": a.block, "runs": runs, "summary": summary})
    for s in summary:
        print(f"{s['method']:9} {s['case']:9} artsdk +{s['ours_overhead_us']:.0f} us/call, ART +{s['art_overhead_us']:.0f} us/call: "
              f"ratio {s['mean_ratio']:.2f} ± {s['sd']:.2f} (runs: {', '.join(f'{r:.2f}' for r in s['ratios'])})")
        if "cpu_ratios" in s:
            print(f"{'':9} {'':9} in CPU time: artsdk +{s['ours_cpu_us']:.0f} us/call, ART +{s['art_cpu_us']:.0f} us/call: "
                  f"ratio {s['mean_cpu_ratio']:.2f} ± {s['cpu_sd']:.2f} (runs: {', '.join(f'{r:.2f}' for r in s['cpu_ratios'])})")


if __name__ == "__main__":
    main()
