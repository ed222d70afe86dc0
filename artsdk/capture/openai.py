"""Capture for the ``openai`` client: ``chat.completions.create`` and ``.parse`` on
``OpenAI`` and ``AsyncOpenAI`` (and ``.stream()``, which goes through ``create``).

The patch sits on the resource classes, not on the HTTP transport, so it sees the same
arguments and objects agent code sees whatever HTTP library the client uses underneath.
"""

from __future__ import annotations

import json
import weakref
from time import perf_counter
from typing import Any, Callable, Optional

from . import context
from .context import (Recorder, Route, current_cassette, current_recorder, hint_misspelt_model, inside_call,
                      route_for, routes)
from .record import (
    StreamAccumulator,
    chunks_from_call,
    failed_call,
    from_response,
    request_parts,
    response_from_call,
)

_RAW_HEADER = "X-Stainless-Raw-Response"
_routed_clients: "weakref.WeakKeyDictionary[Any, dict[Route, Any]]" = weakref.WeakKeyDictionary()


def patch(module: Any) -> None:
    """Wrap the chat-completion methods of an imported ``openai`` module (idempotent)."""
    from openai.resources.chat.completions import AsyncCompletions, Completions

    for cls, is_async in ((Completions, False), (AsyncCompletions, True)):
        for name in ("create", "parse"):
            orig = cls.__dict__.get(name)
            if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                continue
            wrapper = _wrap_async(orig, name) if is_async else _wrap_sync(orig, name)
            wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
            wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
            wrapper.__name__ = name
            wrapper.__doc__ = orig.__doc__
            setattr(cls, name, wrapper)


def unpatch(module: Any) -> None:
    from openai.resources.chat.completions import AsyncCompletions, Completions

    for cls in (Completions, AsyncCompletions):
        for name in ("create", "parse"):
            fn = cls.__dict__.get(name)
            if getattr(fn, "__artsdk_wrapped__", False):
                setattr(cls, name, fn.__wrapped__)


def _routed(resource: Any, model: Any) -> tuple[Any, dict[str, Any] | None]:
    """The resource to send to: for a trainable model during a session, the same client
    pointed at the backend's endpoint."""
    found = route_for(model)
    if found is None:
        return resource, None
    route, send_as = found
    client = resource._client
    per_client = _routed_clients.setdefault(client, {})
    target = per_client.get(route)
    if target is None:
        # forget copies made for sessions that have ended (their servers are gone)
        live = set(routes.values())
        for old in [r for r in per_client if r not in live]:
            del per_client[old]
        target = client.with_options(base_url=route.base_url, api_key=route.api_key).chat.completions
        per_client[route] = target
    return target, ({"model": send_as} if send_as != model else None)


def _is_raw(kwargs: dict[str, Any]) -> bool:
    headers = kwargs.get("extra_headers")
    return bool(headers) and headers.get(_RAW_HEADER) is not None


def _wrap_sync(orig: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return orig(self, *args, **kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(self, kwargs, kind, cassette)
        target, override = _routed(self, kwargs.get("model"))
        send = {**kwargs, **override} if override else kwargs
        rec = current_recorder.get()
        token = inside_call.set(True)
        t0 = perf_counter()
        try:
            resp = orig(target, *args, **send)
        except BaseException as exc:
            if rec is not None:
                rec.add(failed_call("openai", kwargs, exc, perf_counter() - t0))
            hint_misspelt_model(exc, kwargs.get("model"))
            raise
        finally:
            inside_call.reset(token)
        if rec is not None:
            _record(rec, kwargs, resp, t0, is_async=False)
        return resp

    return call


def _wrap_async(orig: Callable[..., Any], kind: str) -> Callable[..., Any]:
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return await orig(self, *args, **kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(self, kwargs, kind, cassette)
        target, override = _routed(self, kwargs.get("model"))
        send = {**kwargs, **override} if override else kwargs
        rec = current_recorder.get()
        token = inside_call.set(True)
        t0 = perf_counter()
        try:
            resp = await orig(target, *args, **send)
        except BaseException as exc:
            if rec is not None:
                rec.add(failed_call("openai", kwargs, exc, perf_counter() - t0))
            hint_misspelt_model(exc, kwargs.get("model"))
            raise
        finally:
            inside_call.reset(token)
        if rec is not None:
            _record(rec, kwargs, resp, t0, is_async=True)
        return resp

    return call


def _record(rec: Recorder, kwargs: dict[str, Any], resp: Any, t0: float, *, is_async: bool) -> None:
    if kwargs.get("stream") is True:
        if not _is_raw(kwargs):
            _watch_stream(rec, kwargs, resp, t0, is_async)
        return
    if _is_raw(kwargs):
        # with_raw_response: the parsed body is cached by the response object
        resp = resp.parse()
    rec.add(from_response("openai", kwargs, resp, perf_counter() - t0))


def _watch_stream(rec: Recorder, kwargs: dict[str, Any], stream: Any, t0: float, is_async: bool) -> None:
    """Record the stream the agent iterates without changing it: the chunks pass through
    untouched, and the assembled call is recorded when the stream ends, is closed, is left
    early, or when the rollout finishes first."""
    acc = StreamAccumulator("openai", kwargs)
    done = False

    def finish(left_early: bool, failure: Optional[str] = None) -> None:
        nonlocal done
        if not done:
            done = True
            rec.fill(slot, acc.to_call(perf_counter() - t0, left_early, failure))

    slot = rec.reserve(lambda: finish(True))
    inner = stream._iterator
    orig_close = stream.close

    if is_async:
        async def agen() -> Any:
            complete, failure = False, None
            try:
                async for chunk in inner:
                    acc.add(chunk)
                    yield chunk
                complete = True
            except Exception as e:
                failure = f"{type(e).__name__}: {e}"
                raise
            finally:
                finish(not complete, failure)

        async def aclose() -> None:
            try:
                await orig_close()
            finally:
                finish(True)

        stream._iterator = agen()
        stream.close = aclose
    else:
        def gen() -> Any:
            complete, failure = False, None
            try:
                for chunk in inner:
                    acc.add(chunk)
                    yield chunk
                complete = True
            except Exception as e:
                failure = f"{type(e).__name__}: {e}"
                raise
            finally:
                finish(not complete, failure)

        def close() -> None:
            try:
                orig_close()
            finally:
                finish(True)

        stream._iterator = gen()
        stream.close = close


def _replay(resource: Any, kwargs: dict[str, Any], kind: str, cassette: context.Cassette) -> Any:
    """Answer from the recording with the same object types the network would give."""
    import httpx2
    from openai import AsyncStream, Stream
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    model, messages, tools, _ = request_parts(kwargs)
    call = cassette.next_call(model, messages, tools)
    rec = current_recorder.get()
    if rec is not None:
        rec.add(call.model_copy(deep=True))
    if kwargs.get("stream") is True:
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks_from_call(call)) + "data: [DONE]\n\n"
        response = httpx2.Response(
            200, content=body.encode(), headers={"content-type": "text/event-stream"},
            request=httpx2.Request("POST", "http://replay.invalid/chat/completions"),
        )
        client = resource._client
        cls = AsyncStream if type(resource).__name__.startswith("Async") else Stream
        return cls(cast_to=ChatCompletionChunk, response=response, client=client)
    completion = ChatCompletion.model_validate(response_from_call(call))
    if kind == "parse":
        from openai import omit
        from openai.lib._parsing._completions import parse_chat_completion

        return parse_chat_completion(
            response_format=kwargs.get("response_format", omit),
            input_tools=kwargs.get("tools", omit),
            chat_completion=completion,
        )
    return completion
