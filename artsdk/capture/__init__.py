"""Transparent capture of LLM calls made inside a rollout.

``install()`` (run by ``import artsdk``) patches each supported client library when it is
imported, or at once if it already was: artsdk never imports a client library itself, so a
user who never imports litellm never pays for it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional, Sequence

from .context import Recorder, Route, current_recorder, routes

__all__ = ["install", "uninstall", "Recorder", "Route", "current_recorder", "routes"]


@dataclass(frozen=True)
class Patcher:
    """How one client library is captured: the artsdk module whose ``patch(library,
    *surfaces)`` / ``unpatch(...)`` wrap it, and the API surfaces it wraps
    (``"module:NAME"``, each one file of its own)."""

    module: str
    surfaces: tuple[str, ...] = ()

    def resolved(self) -> list[Any]:
        out = []
        for ref in self.surfaces:
            module, _, name = ref.partition(":")
            out.append(getattr(importlib.import_module(module), name))
        return out


# every library artsdk patches, and the surfaces of each
PATCHERS = {
    "openai": Patcher("artsdk.capture.openai_patch",
                      ("artsdk.capture.openai:CHAT", "artsdk.capture.openai_responses:RESPONSES")),
    "litellm": Patcher("artsdk.capture.litellm_patch",
                       ("artsdk.capture.litellm:COMPLETION", "artsdk.capture.litellm_responses:RESPONSES")),
    "anthropic": Patcher("artsdk.capture.anthropic_messages", ("artsdk.capture.anthropic_messages:MESSAGES",
                                                               "artsdk.capture.anthropic_messages:BETA_MESSAGES")),
    "dspy": Patcher("artsdk.capture.dspy"),
    # escaped calls, reported (sentinel.py), under every HTTP library an agent may reach a model through
    "httpx": Patcher("artsdk.capture.sentinel_httpx"),
    "httpx2": Patcher("artsdk.capture.sentinel_httpx"),
    "http.client": Patcher("artsdk.capture.sentinel_urllib"),
    "aiohttp": Patcher("artsdk.capture.sentinel_aiohttp"),
    "socket": Patcher("artsdk.capture.sentinel_socket"),  # and under them all, any other HTTP/1.1 client
    "ssl": Patcher("artsdk.capture.sentinel_socket"),
    # the rollout's context into threads and executors started inside it
    "threading": Patcher("artsdk.capture.threads"),
}

_lock = threading.RLock()
_patched: set[str] = set()


def _apply(name: str, module: ModuleType) -> None:
    with _lock:
        if name in _patched:
            return
        patcher = PATCHERS[name]
        importlib.import_module(patcher.module).patch(module, *patcher.resolved())
        _patched.add(name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Lets the real finders load a client library, then patches it before the importing
    code gets the module back (so ``from litellm import completion`` binds the patch)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname not in PATCHERS or fullname in _patched:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _apply(fullname, module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_finder = _PatchOnImport()


def install() -> None:
    """Patch supported client libraries now if imported, else when they are imported."""
    with _lock:
        for name in PATCHERS:
            if name in sys.modules:
                _apply(name, sys.modules[name])
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Undo every patch (mainly for benchmarks that compare with and without capture)."""
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for name in list(_patched):
            patcher = PATCHERS[name]
            importlib.import_module(patcher.module).unpatch(sys.modules[name], *patcher.resolved())
            _patched.discard(name)
