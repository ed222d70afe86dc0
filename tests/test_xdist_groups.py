"""`make test` runs the suite in two workers and counts on the tests of one ``xdist_group``
(those on Ray, those on vLLM, conftest.py) running in one worker, one after another:
tests/xdist_groups.py makes it so on pytest 9.2, where pytest-xdist's own grouping is lost
with no word. Here a small suite of its own runs the way `make test` runs the real one."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

SUITE = '''
import pytest

together = pytest.mark.xdist_group("together")


@together
@pytest.mark.parametrize("i", range(4))
def test_grouped_{n}(i):
    pass


@pytest.mark.parametrize("i", range(4))
def test_alone_{n}(i):
    pass
'''


def test_the_tests_of_a_group_run_in_one_worker(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"test_{n}.py").write_text(SUITE.format(n=n))
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(root)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                          "-p", "tests.xdist_groups", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", run.stdout)
    assert len(ran) == 16, run.stdout[-3000:]
    grouped = [(worker, test) for worker, test in ran if "grouped" in test]
    assert len(grouped) == 8 and all(test.endswith("@together") for _, test in grouped), grouped
    assert len({worker for worker, _ in grouped}) == 1, grouped  # one worker ran all eight
