"""What every benchmark shares: where results go, and where the pages made from them go."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def model_arguments(description: str | None = None, *,
                    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> argparse.ArgumentParser:
    """The command line every benchmark of a model starts from: ``--model`` and ``--threads``
    (torch's threads in the process, pinned); each benchmark adds its own options."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default=model)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in this process (pinned)")
    return ap


def pin_threads(threads: int = 2) -> int:
    """Pin torch's threads in this process (every benchmark does, and prints how many: a run
    whose threads follow the machine measures the machine)."""
    import torch

    torch.set_num_threads(threads)
    print(f"threads: {torch.get_num_threads()} (torch)", flush=True)
    return torch.get_num_threads()


def load_result(name: str) -> dict[str, Any] | None:
    """``bench/results/<name>.json`` as written by ``save_result``, or None where none was."""
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def save_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (read by ``python -m bench.report``)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


async def local_model(base_model: str, home: str, name: str = "bench") -> tuple[Any, Any, Any]:
    """A local backend (CPU) serving ``base_model``: (backend, TrainableModel, Endpoint)."""
    import artsdk as art
    from backends.local import LocalBackend

    backend = LocalBackend(device="cpu", home=home)
    model = art.TrainableModel(name, base_model=base_model, project="bench")
    endpoint = await backend.register(model)
    return backend, model, endpoint
