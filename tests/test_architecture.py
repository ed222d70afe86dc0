"""The house drawn from imports: the import-linter contracts in pyproject.toml hold (no
circle at any depth, layers only point down, the client SDK never imports a backend), a
circle put in on purpose breaks them, and every module opens by saying what it is for."""

import ast
import shutil
import subprocess
import sys
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


@needs_linter
def test_a_circle_breaks_the_contracts(tmp_path):
    # the circle this house once had: the capture layer reaching up into replay
    for name in ("artsdk", "backends", "pyproject.toml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    context = tmp_path / "artsdk" / "capture" / "context.py"
    context.write_text(context.read_text() + "\n\ndef _check():\n    from ..replay import rerun  # noqa\n")
    out = lint(tmp_path)
    assert out.returncode != 0
    assert "no import cycles" in out.stdout and "BROKEN" in out.stdout


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
