"""TensorBoard: one event file per model under ``<home>/tensorboard/<project>/<model>``
(``log_dir`` to choose), one scalar per metric at each step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


class TensorBoard:
    def __init__(self, model: Any, *, home: Optional[str] = None, log_dir: Optional[str] = None) -> None:
        from tensorboardX import SummaryWriter

        folder = Path(log_dir) if log_dir else Path(home or ".artsdk") / "tensorboard" / model.project / model.name
        self.writer = SummaryWriter(logdir=str(folder))
        self.log_dir = folder

    def log(self, model: Any, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
