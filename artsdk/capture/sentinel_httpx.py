"""The escape sentinel (``sentinel.py``) under ``httpx`` and ``httpx2``: ``Client.send`` and
``AsyncClient.send``, through which the openai client, litellm and most frameworks send.

The client's event hooks run inside ``send`` but are the agent's own code, not part of the
request they watch: they run as if no patched call were running, so a call a hook makes is a
call of its own (recorded when patched, judged here when not). The request itself goes on to
the transport (``_send_single_request``) as it came, judged once, here.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Optional

from .context import current_recorder, inside_call
from .sentinel import check, judged

# whether a patched call was running when the request now being sent entered ``send``
_sent_inside: ContextVar[Optional[bool]] = ContextVar("artsdk_sent_inside", default=None)


def patch(module: Any) -> None:
    """Wrap ``send`` and ``_send_single_request`` of ``Client`` and ``AsyncClient`` of an
    imported httpx / httpx2 (idempotent)."""
    for cls, is_async in ((module.Client, False), (module.AsyncClient, True)):
        for name, make in (("send", _async_send if is_async else _sync_send),
                           ("_send_single_request", _async_transport if is_async else _sync_transport)):
            orig = cls.__dict__.get(name)
            if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                continue
            wrapper = make(orig, module.__name__)
            wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
            wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
            setattr(cls, name, wrapper)


def unpatch(module: Any) -> None:
    for cls in (module.Client, module.AsyncClient):
        for name in ("send", "_send_single_request"):
            fn = cls.__dict__.get(name)
            if getattr(fn, "__artsdk_wrapped__", False):
                setattr(cls, name, fn.__wrapped__)


def _agent_code_inside(client: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``send`` will run code of the agent's: an event hook, or an auth flow."""
    hooks = client._event_hooks
    auth = kwargs.get("auth")
    return bool(hooks["request"] or hooks["response"] or client._auth is not None
                or (auth is not None and type(auth).__name__ != "UseClientDefault"))


def _check(request: Any, library: str) -> None:
    if inside_call.get():
        return  # a patched call sending (the usual case): nothing to judge, no URL to spell out
    check(request.method, str(request.url), request.url.path, f"a {library} client", request.headers)


# Inline, not context managers: capture runs these on every call, and a generator-based context
# manager costs several times the two variables it sets. Outside a rollout there is nothing to do.

def _sync_send(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is None:
            return orig(self, request, *args, **kwargs)
        if inside_call.get() and not _agent_code_inside(self, kwargs):
            # a patched call sending (the usual case), and nothing of the agent's runs on the way:
            # the request is judged (passed) once, here, for the transport and the sockets below
            judging = judged.set(True)
            try:
                return orig(self, request, *args, **kwargs)
            finally:
                judged.reset(judging)
        _check(request, library)
        # the client's event hooks run as the agent (no patched call running); the transport learns
        # whether one was
        sent, running = _sent_inside.set(inside_call.get()), inside_call.set(False)
        try:
            return orig(self, request, *args, **kwargs)
        finally:
            inside_call.reset(running)
            _sent_inside.reset(sent)

    return send


def _async_send(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is None:
            return await orig(self, request, *args, **kwargs)
        if inside_call.get() and not _agent_code_inside(self, kwargs):  # as in _sync_send
            judging = judged.set(True)
            try:
                return await orig(self, request, *args, **kwargs)
            finally:
                judged.reset(judging)
        _check(request, library)
        sent, running = _sent_inside.set(inside_call.get()), inside_call.set(False)  # as in _sync_send
        try:
            return await orig(self, request, *args, **kwargs)
        finally:
            inside_call.reset(running)
            _sent_inside.reset(sent)

    return send


def _sync_transport(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    def send_single(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is None or judged.get():  # judged: passed by ``send`` at once
            return orig(self, request, *args, **kwargs)
        # the request as ``send`` was given it, judged there once: the sentinels below let it pass
        running, judging = inside_call.set(bool(_sent_inside.get())), judged.set(True)
        try:
            return orig(self, request, *args, **kwargs)
        finally:
            judged.reset(judging)
            inside_call.reset(running)

    return send_single


def _async_transport(orig: Callable[..., Any], library: str) -> Callable[..., Any]:
    async def send_single(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if current_recorder.get() is None or judged.get():  # as in _sync_transport
            return await orig(self, request, *args, **kwargs)
        running, judging = inside_call.set(bool(_sent_inside.get())), judged.set(True)  # as in _sync_transport
        try:
            return await orig(self, request, *args, **kwargs)
        finally:
            judged.reset(judging)
            inside_call.reset(running)

    return send_single
