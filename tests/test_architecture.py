"""The house drawn from imports: the import-linter contracts in pyproject.toml hold (no
circle at any depth, layers only point down, the client SDK never imports a backend), a
circle put in on purpose breaks them, and every module opens by saying what it is for."""

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")
needs_linter = pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev tool: pip install -e '.[dev]'")


def lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(folder / "pyproject.toml"), "--no-cache"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})


@needs_linter
def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


# one deliberate break per contract: (the module changed, the line added, the contract it breaks)
BREAKS = [
    # the circle this house once had: the capture layer reaching up into replay
    ("artsdk/capture/context.py", "from ..replay import rerun", "no import cycles"),
    ("artsdk/store/query.py", "from backends.http import GuardedH11", "the client SDK never imports a backend"),
    # an arrow up that makes no circle: capture reaching for the run's gather
    ("artsdk/capture/record.py", "from ..run.gather import gather", "artsdk: entry points on top"),
    ("artsdk/rollout/reconcile.py", "from ..viewer.app import serve", "artsdk: entry points on top"),
    ("artsdk/run/gather.py", "from .session import Session", "the run: the session over"),
    ("artsdk/rollout/reconcile.py", "from .decorator import Rollout", "the rollout: the decorator over"),
    ("artsdk/rewards/functions.py", "from .judge import Judge", "rewards: the judge"),
    ("artsdk/trajectory/response_items.py", "from .records import Trajectory", "the trajectory: its records"),
    ("backends/http.py", "from .local.models import load", "backends: each backend beside the others"),
]


def _with_a_break(tmp_path: Path, module: str, line: str) -> Path:
    for name in ("artsdk", "backends", "pyproject.toml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _broken():\n    {line}  # noqa\n")
    return tmp_path


@needs_linter
@pytest.mark.parametrize("module,line,contract", BREAKS, ids=[f"{b[2]}:{b[0]}" for b in BREAKS])
def test_each_contract_breaks_when_its_rule_is_broken(tmp_path, module, line, contract):
    # an import inside a function is still an import: the linter sees it, as a reader does
    names = [c["name"] for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]
    [name] = [n for n in names if n.startswith(contract)]
    out = lint(_with_a_break(tmp_path, module, line))
    assert out.returncode != 0
    assert f"{name} BROKEN" in " ".join(out.stdout.split()), out.stdout[-3000:]  # the linter wraps long names


def test_artsdk_keeps_its_concepts_in_folders():
    # a newcomer finds the run, the trajectory, rewards and the test helpers by folder name
    loose = sorted(p.name for p in (ROOT / "artsdk").glob("*.py") if p.name not in ("__init__.py", "_version.py"))
    assert len(loose) <= 8, f"{len(loose)} loose modules at artsdk's top level: {loose}"
    for folder in ("run", "rollout", "rewards", "trajectory", "testing", "capture", "store", "viewer", "trackers"):
        assert (ROOT / "artsdk" / folder / "__init__.py").is_file(), folder


def test_every_module_says_what_it_is_for():
    missing = []
    for package in ("artsdk", "backends"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_version.py":
                continue
            doc = ast.get_docstring(ast.parse(path.read_text()))
            if not doc or len(doc) < 20:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules without an opening docstring: {missing}"
