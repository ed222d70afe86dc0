"""A sentinel below the patched clients: every HTTP request an ``httpx`` or ``httpx2``
client (openai's, litellm's, any framework's own) sends to an LLM route inside a rollout is
checked against the capture patches. A request made while no patched call is in progress
escaped capture: it is noted on the trajectory (``warnings``), counted by ``art.gather``,
and with ``strict_capture = true`` refused before it is sent (CaptureError), so a rollout
never trains on a partial record without anyone knowing.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import CaptureError
from .context import current_recorder, inside_call

LLM_ROUTES = ("/chat/completions", "/responses", "/completions", "/messages")
ESCAPED = "an LLM call escaped capture"


def patch(module: Any) -> None:
    """Wrap ``Client.send`` and ``AsyncClient.send`` of an imported httpx / httpx2 (idempotent)."""
    for cls, is_async in ((module.Client, False), (module.AsyncClient, True)):
        orig = cls.__dict__.get("send")
        if orig is None or getattr(orig, "__artsdk_wrapped__", False):
            continue
        wrapper = _async_send(orig) if is_async else _sync_send(orig)
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        cls.send = wrapper


def unpatch(module: Any) -> None:
    for cls in (module.Client, module.AsyncClient):
        fn = cls.__dict__.get("send")
        if getattr(fn, "__artsdk_wrapped__", False):
            cls.send = fn.__wrapped__


def _check(request: Any) -> None:
    rec = current_recorder.get()
    if rec is None or inside_call.get() or request.method != "POST":
        return
    path = request.url.path.rstrip("/")
    if not path.endswith(LLM_ROUTES):
        return
    where = "POST " + str(request.url).split("?")[0]
    note = (f"{ESCAPED}: {where} was sent by a client artsdk does not patch, so this trajectory does not "
            f"hold it. Make the call through the openai client or litellm (or a framework built on them), "
            f"see docs/capture.md")
    from ..config import settings

    if settings().strict_capture:
        raise CaptureError(note + " (strict_capture refused to send it)")
    rec.note(note)


def _sync_send(orig: Callable[..., Any]) -> Callable[..., Any]:
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _check(request)
        return orig(self, request, *args, **kwargs)

    return send


def _async_send(orig: Callable[..., Any]) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _check(request)
        return await orig(self, request, *args, **kwargs)

    return send
