"""Weights & Biases: one run per session, named after the model; ``mode="offline"`` works
with no account and no network (``wandb sync`` uploads it later). Other options go to
``wandb.init`` as they are (``project``, ``entity``, ``dir``, ``tags``...)."""

from __future__ import annotations

from typing import Any, Optional


class WandB:
    def __init__(self, model: Any, *, home: Optional[str] = None, **options: Any) -> None:
        import wandb

        options.setdefault("project", model.project)
        options.setdefault("name", model.name)
        if home is not None:
            options.setdefault("dir", home)
        options.setdefault("config", {"base_model": model.base_model, **model.config})
        self.run = wandb.init(reinit="create_new", **options)

    def log(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()
