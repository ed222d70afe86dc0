"""Every ```python block in docs/ runs: each page's blocks, in order, as one script, against
the scripted loopback server (docs/testing.md runs under pytest, as its readers would)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if "```python" in p.read_text())


def blocks(page: Path) -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_doc_examples_run(page, server, tmp_path):
    script = tmp_path / f"doc_{page.stem}.py"
    script.write_text(blocks(page))
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "doc-key",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)] \
        if page.name == "testing.md" else [sys.executable, str(script)]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"{page.name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
