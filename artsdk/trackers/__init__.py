"""Training metrics to the trackers teams already use, chosen by configuration:

```toml
# artsdk.toml
trackers = ["tensorboard", "wandb", "mlflow"]

[tracker_options.wandb]
mode = "offline"
```

A tracker is a small class with ``log(model, step, metrics)`` and ``close()`` (``Tracker``),
in a file of its own here, its library imported only when it is configured. ``art.session``
opens the configured ones and logs every training step: the trainer's metrics (loss, clip
fraction, KL, tokens, seconds...) and the batch's reward statistics.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional, Protocol, runtime_checkable

from ..errors import ConfigError

TRACKERS = {
    "tensorboard": "artsdk.trackers.tensorboard:TensorBoard",
    "wandb": "artsdk.trackers.wandb:WandB",
    "mlflow": "artsdk.trackers.mlflow:MLflow",
}
EXTRAS = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow-skinny"}


@runtime_checkable
class Tracker(Protocol):
    """Where a session's training metrics go."""

    def log(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        """Record one training step's metrics."""
        ...

    def close(self) -> None:
        """Flush and let go (the session has ended)."""
        ...


def open_trackers(names: list[str], options: dict[str, dict[str, Any]], model: Any,
                  home: Optional[str] = None) -> list[Tracker]:
    """The configured trackers, opened for ``model``. ConfigError names an unknown tracker
    or a missing library."""
    out: list[Tracker] = []
    for name in names:
        target = TRACKERS.get(name)
        if target is None:
            raise ConfigError(f"unknown tracker {name!r} in the trackers setting; known: {sorted(TRACKERS)}")
        module, cls = target.split(":")
        try:
            tracker_cls = getattr(importlib.import_module(module), cls)
        except ImportError as e:
            raise ConfigError(f"tracker {name!r} needs its library ({e}); pip install {EXTRAS[name]}") from None
        out.append(tracker_cls(model, home=home, **options.get(name, {})))
    return out
