"""Checkpoints: ``<root>/<project>/<model>/checkpoints/<step>/`` holding the LoRA adapter
(peft's format: ``adapter_config.json`` + ``adapter_model.safetensors``), the optimizer
state and the trainer state. Each is written to a temporary folder first and renamed into
place, so a killed run never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

_STEP = re.compile(r"^\d+$")
log = logging.getLogger("artsdk.local")


class Checkpoints:
    def __init__(self, folder: Path, adapter: str = "policy") -> None:
        self.folder = folder
        self.adapter = adapter
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.tmp*"):  # left by a run killed while writing
            shutil.rmtree(stale, ignore_errors=True)

    def steps(self) -> list[int]:
        return sorted(int(p.name) for p in self.folder.iterdir()
                      if p.is_dir() and _STEP.match(p.name) and (p / "trainer_state.json").is_file())

    def latest(self) -> Optional[int]:
        s = self.steps()
        return s[-1] if s else None

    def path(self, step: int) -> Path:
        return self.folder / str(step)

    def save(self, step: int, model: Any, optimizer: Any, state: dict[str, Any]) -> Path:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        final = self.path(step)
        tmp = self.folder / f"{step}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = get_peft_model_state_dict(model, adapter_name=self.adapter)
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()},
                  str(tmp / "adapter_model.safetensors"))
        config = model.peft_config[self.adapter].to_dict()
        config["target_modules"] = sorted(config["target_modules"]) if isinstance(
            config.get("target_modules"), (set, list)) else config.get("target_modules")
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str))
        torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}, tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        return final

    def files(self, step: int, names: Optional[tuple[str, ...]] = None) -> dict[str, bytes]:
        """The files of a checkpoint (or only ``names``) as bytes, to send to another machine."""
        folder = self.path(step)
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
                if p.is_file() and (names is None or p.name in names)}

    def write(self, step: int, files: dict[str, bytes]) -> Path:
        """A checkpoint made of ``files`` (from ``files`` elsewhere), written as ``save`` writes
        one: to a temporary folder first, then renamed into place."""
        if not files or any("/" in n or n.startswith(".") for n in files):
            raise ValueError(f"not the files of a checkpoint: {sorted(files)}")
        final = self.path(step)
        tmp = self.folder / f"{step}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        return final

    def remove(self, step: int) -> None:
        shutil.rmtree(self.path(step), ignore_errors=True)

    def state(self, step: int) -> dict[str, Any]:
        """The trainer state saved with a step (its metrics, the model it belongs to)."""
        return json.loads((self.path(step) / "trainer_state.json").read_text())

    def load(self, step: int, model: Any, optimizer: Any) -> dict[str, Any]:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = self.path(step)
        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")),
                                  adapter_name=self.adapter)
        # a checkpoint written on a GPU resumes on a CPU machine: read everything onto the CPU
        # (load_state_dict then moves the optimizer's state to wherever its parameters are)
        extra = torch.load(folder / "optimizer.pt", weights_only=False, map_location="cpu")
        optimizer.load_state_dict(extra["optimizer"])
        torch.set_rng_state(extra["rng"])
        return self.state(step)

    def prune(self, keep_last: int, best_metric: Optional[str] = None, higher_is_better: bool = True) -> list[int]:
        """Delete all but the last ``keep_last`` checkpoints (and the best by
        ``best_metric``); returns the steps deleted."""
        steps = self.steps()
        keep = set(steps[-keep_last:]) if keep_last > 0 else set()
        if best_metric:
            scored = []
            for s in steps:
                m = self.state(s).get("metrics", {})
                if isinstance(m.get(best_metric), (int, float)):
                    scored.append((m[best_metric], s))
            if scored:
                keep.add((max if higher_is_better else min)(scored)[1])
        gone = [s for s in steps if s not in keep]
        for s in gone:
            shutil.rmtree(self.path(s), ignore_errors=True)
        return gone


def move_aside(folder: Path) -> Optional[Path]:
    """Rename a model's checkpoints folder to ``checkpoints.<time>`` when it holds any (they
    are never deleted); the folder it went to, or None."""
    import time

    if not folder.is_dir() or not any(p.name.isdigit() for p in folder.iterdir()):
        return None
    kept = folder.with_name(f"{folder.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while kept.exists():
        kept, n = folder.with_name(f"{folder.name}.{time.strftime('%Y%m%d-%H%M%S')}.{n}"), n + 1
    folder.rename(kept)
    log.info("starting fresh: the earlier checkpoints were moved to %s", kept)
    return kept
