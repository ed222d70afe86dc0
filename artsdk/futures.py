"""Answering a concurrent future that its waiter may have given up on."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from typing import Any, Optional


def settle(future: "Future[Any]", result: Any = None, error: Optional[BaseException] = None) -> None:
    """Set ``future``'s result (or ``error``), unless it was cancelled meanwhile: a waiter that
    gives up (Ctrl-C cancels the awaiting task, and with it the future) must not make the
    thread answering it -- the store's writer, an inference engine -- raise and die."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass
