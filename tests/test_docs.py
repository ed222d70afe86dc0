"""Every snippet in docs/ runs as written, the way a reader would run it: each page's
```python blocks, in order, as one script, in a fresh folder with no OPENAI_* or ARTSDK_*
variable set (a page that needs a model server starts the stand-in one in its first lines),
then its ```bash blocks where they are quick commands; and each quick page runs twice in that
folder, since a reader runs an example again (the pages that train SmolLM2 for minutes run once:
a second run would repeat the first, as they start their run afresh with ``resume=False``).
(docs/testing.md runs under pytest, as its readers would.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import on_ray

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if "```python" in p.read_text())
SHELL = {"store.md"}  # pages whose ```bash blocks are quick commands (the others start servers or runs)


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page.read_text(), re.S)


def reader_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ARTSDK_", "PYTEST_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the venv's artsdk
    env["HOME"] = str(tmp_path / "home")  # nothing of the test machine's own config
    env["ARTSDK_CACHE"] = os.environ.get("ARTSDK_CACHE", str(Path.home() / ".cache" / "artsdk"))  # built models
    return env


SLOW = {"your-agent.md": 900, "scale.md": 400}  # train SmolLM2 for a few steps: minutes, once


def page_marks(page: Path) -> list:
    """A page's time limit; a page whose code starts a Ray instance never runs beside another
    test that does (conftest.py)."""
    ray = any('backend="ray"' in b for b in blocks(page, "python"))
    return [pytest.mark.timeout(SLOW.get(page.name, 300)), *([on_ray] if ray else [])]


@pytest.mark.parametrize("page", [pytest.param(p, marks=page_marks(p)) for p in PAGES],
                         ids=[p.name for p in PAGES])
def test_doc_examples_run_as_written(page, tmp_path):
    script = tmp_path / f"doc_{page.stem}.py"
    script.write_text("\n\n".join(blocks(page, "python")))
    env = reader_env(tmp_path)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)] \
        if page.name == "testing.md" else [sys.executable, str(script)]
    for run in (1,) if page.name in SLOW else (1, 2):
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=SLOW[page.name] - 10 if page.name in SLOW else 140)
        assert out.returncode == 0, f"{page.name}, run {run}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        if page.name in SHELL:
            for line in (x for b in blocks(page, "bash") for x in b.splitlines() if x.strip()):
                sh = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=120)
                assert sh.returncode == 0, f"{page.name}: {line}\n{sh.stdout[-2000:]}\n{sh.stderr[-2000:]}"
                assert "0 of 0 shown" not in sh.stdout
            (tmp_path / "best.jsonl").unlink()  # the page's export, made again by the second run
