"""The process's default store: the one the settings name, opened on first use and closed
(to be reopened from the new settings) whenever ``art.configure`` changes them."""

from __future__ import annotations

import threading
from typing import Optional

from .. import config
from .store import Store

_default: Optional[Store] = None
_lock = threading.Lock()


def default_store() -> Store:
    """The store named by the settings, opened once per process."""
    global _default
    with _lock:
        if _default is None:
            _default = Store()
        return _default


def reset_default() -> None:
    """Close the default store so the next use reopens it from the (new) settings."""
    global _default
    with _lock:
        if _default is not None:
            _default.close()
        _default = None


config.on_change(reset_default)
