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
from typing import Any, Callable, Optional

import torch

from artsdk.errors import CheckpointError

FILES = ("adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "trainer_state.json")
ASIDE = "set-aside"  # steps after the one resumed from, moved here (never deleted)
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

    def save(self, step: int, model: Any, optimizer: Any, state: dict[str, Any],
             whole: Optional[tuple[dict[str, torch.Tensor], dict[str, Any]]] = None) -> Path:
        """Write ``model``'s adapter and ``optimizer``'s state as ``step`` -- or ``whole``, the
        adapter's weights and the optimizer's state gathered from sharded ranks (fsdp.gather)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        final = self.path(step)
        tmp = self.folder / f"{step}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = whole[0] if whole else get_peft_model_state_dict(model, adapter_name=self.adapter)
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()},
                  str(tmp / "adapter_model.safetensors"))
        config = model.peft_config[self.adapter].to_dict()
        config["target_modules"] = sorted(config["target_modules"]) if isinstance(
            config.get("target_modules"), (set, list)) else config.get("target_modules")
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str))
        torch.save({"optimizer": whole[1] if whole else optimizer.state_dict(), "rng": torch.get_rng_state()},
                   tmp / "optimizer.pt")
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
        try:
            state = json.loads((self.path(step) / "trainer_state.json").read_text())
            if not isinstance(state, dict):
                raise ValueError(f"a JSON {type(state).__name__}, not an object")
            return state
        except (OSError, ValueError) as e:
            raise self.unreadable(step, "trainer_state.json", e) from None

    def load(self, step: int, model: Any, optimizer: Any,
             put: Optional[Callable[[dict[str, torch.Tensor], dict[str, Any]], None]] = None) -> dict[str, Any]:
        """Load ``step`` into ``model`` and ``optimizer`` (or hand its adapter weights and
        optimizer state to ``put``: a sharded model's ranks each take their share, fsdp.scatter);
        the trainer state saved with it."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = self.path(step)
        name = "adapter_model.safetensors"
        try:
            weights = load_file(str(folder / name))
            # a checkpoint written on a GPU resumes on a CPU machine: read everything onto the CPU
            # (load_state_dict then moves the optimizer's state to wherever its parameters are)
            name = "optimizer.pt"
            extra = torch.load(folder / name, weights_only=False, map_location="cpu")
            if put is not None:
                name = "adapter_model.safetensors"  # (its keys are what a sharded model checks first)
                put(weights, extra["optimizer"])
            else:
                name = "adapter_model.safetensors"
                set_peft_model_state_dict(model, weights, adapter_name=self.adapter)
                name = "optimizer.pt"
                optimizer.load_state_dict(extra["optimizer"])
            torch.set_rng_state(extra["rng"])
        except Exception as e:  # noqa: BLE001 - safetensors, torch and pickle each raise their own
            raise self.unreadable(step, name, e) from None
        return self.state(step)

    def check(self, step: int) -> Optional[tuple[str, str]]:
        """None when every file of ``step`` can be read, else (the first file that cannot,
        why). Reads each file whole (the adapter's tensors, the optimizer's state)."""
        from safetensors.torch import load_file

        folder = self.path(step)
        for name in FILES:
            path = folder / name
            try:
                if name.endswith(".json"):
                    if not isinstance(json.loads(path.read_text()), dict):
                        raise ValueError("not a JSON object")
                elif name.endswith(".safetensors"):
                    load_file(str(path))
                else:
                    torch.load(path, weights_only=False, map_location="cpu")
            except Exception as e:  # noqa: BLE001 - any library's complaint means unreadable
                return name, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        return None

    def unreadable(self, step: int, name: str, error: Any) -> CheckpointError:
        """The error for a checkpoint that cannot be read, offering the newest one that can."""
        why = error if isinstance(error, str) else f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
        readable = next((s for s in reversed(self.steps()) if s < step and self.check(s) is None), None)
        offer = (f"the newest readable checkpoint is step {readable}: resume from it with "
                 f"art.session(model, resume={readable}) (the steps after it are moved to {ASIDE}/, never deleted)"
                 if readable is not None else
                 "no earlier checkpoint can be read: start over with art.session(model, resume=False) (the "
                 "checkpoints are moved aside, never deleted)")
        return CheckpointError(f"checkpoint step {step} cannot be read: {self.path(step) / name} ({why}); {offer}",
                               step=step, file=str(self.path(step) / name), readable=readable)

    def resume_point(self, step: Optional[int] = None) -> Optional[int]:
        """The step to resume from: the newest (CheckpointError when it cannot be read), or
        ``step``, after moving every newer step into ``set-aside/``. None: no checkpoint."""
        steps = self.steps()
        if step is None:
            if not steps:
                return None
            newest = steps[-1]
            bad = self.check(newest)
            if bad is not None:
                raise self.unreadable(newest, *bad)
            return newest
        if step and step not in steps:
            raise CheckpointError(f"there is no checkpoint of step {step} in {self.folder} (steps: "
                                  f"{steps or 'none'})", step=step, file=str(self.path(step)), readable=None)
        if step:
            bad = self.check(step)
            if bad is not None:
                raise self.unreadable(step, *bad)
        newer = [s for s in steps if s > step]
        if newer:
            aside = self.folder / ASIDE / time_name()
            aside.mkdir(parents=True)
            for s in newer:
                self.path(s).rename(aside / str(s))
            log.warning("resuming from step %d: steps %s were moved to %s", step, newer, aside)
        return step or None

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


def time_name() -> str:
    import time
    import uuid

    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


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
