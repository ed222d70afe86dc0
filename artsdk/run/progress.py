"""Progress of the long waits -- a gather, a training step, a warm-up -- drawn by tqdm: a bar on
a terminal, and a line every ``LINE_EVERY`` seconds otherwise (a log, a notebook's captured
output, CI), so a run is never silent for minutes. ``progress = false`` (settings) is quiet.

    with Progress("gather play", total=64, unit="rollout") as bar:
        bar.update(1, reward=0.5)
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

LINE_EVERY = 30.0  # seconds between lines when the output is not a terminal


class Progress:
    """What is done of ``total`` (None: unknown), its rate and the time left; ``enabled``: None
    follows the ``progress`` setting (on by default), False is quiet."""

    def __init__(self, label: str, total: Optional[float] = None, unit: str = "it",
                 enabled: Optional[bool] = None) -> None:
        from ..config import settings

        setting = settings().progress
        self.on = (setting if setting is not None else True) if enabled is None else enabled
        self.tty = sys.stderr.isatty()
        self.label, self.total, self.unit = label, total, unit
        self.n = 0.0
        self.info: dict[str, Any] = {}
        self.t0 = self._last = time.monotonic()
        self._bar: Any = None
        if self.on and self.tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True)

    def update(self, n: float = 1, **info: Any) -> None:
        """``n`` more done; ``info`` shown beside (a mean reward, errors)."""
        self.set(self.n + n, **info)

    def set(self, done: float, total: Optional[float] = None, **info: Any) -> None:
        """``done`` of ``total`` (which may be learned late: a step's rows)."""
        if total is not None:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
        delta, self.n = done - self.n, done
        self.info.update({k: v for k, v in info.items() if v is not None})
        if self._bar is not None:
            if self.info:
                self._bar.set_postfix({k: _short(v) for k, v in self.info.items()}, refresh=False)
            self._bar.update(delta)
        elif self.on and time.monotonic() - self._last >= LINE_EVERY:
            self._line()

    def _line(self) -> None:
        from tqdm import tqdm

        self._last = time.monotonic()
        text = tqdm.format_meter(self.n, self.total, self._last - self.t0, prefix=self.label, unit=self.unit,
                                 ncols=0, postfix=", ".join(f"{k}={_short(v)}" for k, v in self.info.items()) or None)
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.on and time.monotonic() - self.t0 >= LINE_EVERY:  # a long wait ends with its last line
            self._line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short(v: Any) -> Any:
    return f"{v:.3f}" if isinstance(v, float) else v
