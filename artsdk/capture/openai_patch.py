"""The machinery that captures the ``openai`` client's resources, on ``OpenAI`` and
``AsyncOpenAI``: a resource's methods are wrapped so that, inside a rollout, each call is
recorded, routed to the backend during a session, and answered from the recording during a
replay. What differs from one resource to the next (chat completions in ``openai.py``, the
Responses API in ``openai_responses.py``) is an ``API``; ``capture/__init__.py`` lists them.
The ``anthropic`` client is built the same way (``anthropic_messages.py`` uses this too).

The patch sits on the resource classes, not on the HTTP transport, so it sees the same
arguments and objects agent code sees whatever HTTP library the client uses underneath.
Every way of reading the answer is recorded: the object, a stream (read to its end, left
early, closed, or still open when the rollout ends), and the raw-response wrappers
(``with_raw_response``, ``with_streaming_response``), whose bytes are decoded as they pass.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Optional

from ..trajectory.records import LLMCall
from . import context, http_body, refusal_retries
from .cassette import Cassette, current_cassette
from .context import Recorder, Route, current_recorder, for_backend, one_call, route_for, routes
from .record import failed_call

_RAW_HEADER = "X-Stainless-Raw-Response"
READ_EVERY = 64  # streamed chunks read into the call at a time (watch_stream)
_routed_clients: "weakref.WeakKeyDictionary[Any, dict[tuple[Route, str], Any]]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class API:
    """What differs between the openai resources artsdk captures."""

    provider: str  # LLMCall.provider
    path: str  # the resource on a client, e.g. "chat.completions"
    classes: Callable[[], tuple[type, type]]  # (sync resource class, async one), imported when patching
    methods: tuple[str, ...]
    request: Callable[[dict[str, Any]], tuple[str, list[dict[str, Any]], Any, dict[str, Any]]]
    from_response: Callable[..., LLMCall]  # (kwargs, response, latency, request=what request(kwargs) gave)
    # (kwargs, the request as sent: ``request(kwargs)``) -> .add(chunk), .to_call(latency, left_early, failure)
    accumulator: Callable[[dict[str, Any], Any], Any]
    parse_body: Callable[[Any], Any]  # a JSON body -> the response object
    parse_event: Callable[[Any], Any]  # one server-sent event's JSON -> the chunk / event object
    replay: Callable[[Any, dict[str, Any], str, LLMCall], Any]  # what the client would have returned
    # the client's base URL for a backend endpoint's (``http://host:port/v1``): clients whose
    # paths already start with /v1 (anthropic's /v1/messages) are pointed at the server's root
    base_url: Callable[[str], str] = lambda url: url


def built_as(type_name: str) -> Callable[[Any], Any]:
    """JSON -> the openai type ``module:Name`` (imported when first used), built leniently, as
    the client itself builds what it receives."""
    def build(data: Any) -> Any:
        import importlib

        from openai._models import construct_type

        module, name = type_name.split(":")
        return construct_type(type_=getattr(importlib.import_module(module), name), value=data)

    return build


def patch(module: Any, *apis: API) -> None:
    """Wrap the methods of each of ``apis`` in an imported ``openai`` module (idempotent)."""
    for api in apis:
        for cls, is_async in zip(api.classes(), (False, True)):
            for name in api.methods:
                orig = cls.__dict__.get(name)
                if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                    continue
                wrapper = _wrap_async(orig, name, api) if is_async else _wrap_sync(orig, name, api)
                wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
                wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
                wrapper.__name__ = name
                wrapper.__doc__ = orig.__doc__
                setattr(cls, name, wrapper)
    refusal_retries.patch(module)


def unpatch(module: Any, *apis: API) -> None:
    """Put back the methods ``patch`` wrapped."""
    for api in apis:
        for cls in api.classes():
            for name in api.methods:
                fn = cls.__dict__.get(name)
                if getattr(fn, "__artsdk_wrapped__", False):
                    setattr(cls, name, fn.__wrapped__)
    refusal_retries.unpatch(module)


def routed(resource: Any, model: Any, api: API) -> tuple[Any, dict[str, Any] | None, bool]:
    """(the resource to send to, the model name to send instead, whether the call goes to a
    backend): for a trainable model during a session, the same client pointed at the
    backend's endpoint -- unless it points at that server already (a rollout's own
    ``art.rollout_env()`` URL, say), which is kept."""
    found = route_for(model) if routes else None  # (no session open: the usual case, decided here)
    if found is None:
        return resource, None, False
    route, send_as = found
    client = resource._client
    override = {"model": send_as} if send_as != model else None
    if _same_server(str(getattr(client, "base_url", "")), route.base_url):
        return resource, override, True
    per_client = _routed_clients.setdefault(client, {})
    target = per_client.get((route, api.path))
    if target is None:
        # forget copies made for sessions that have ended (their servers are gone)
        live = set(routes.values())
        for old in [k for k in per_client if k[0] not in live]:
            del per_client[old]
        target = client.with_options(base_url=api.base_url(route.base_url), api_key=route.api_key)
        for attr in api.path.split("."):
            target = getattr(target, attr)
        per_client[(route, api.path)] = target
    return target, override, True


def _same_server(a: str, b: str) -> bool:
    from urllib.parse import urlsplit

    x, y = urlsplit(a), urlsplit(b)
    return bool(x.netloc) and (x.scheme, x.netloc) == (y.scheme, y.netloc)


def _wrap_sync(orig: Callable[..., Any], kind: str, api: API) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return orig(self, *args, **kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return replayed(self, kwargs, kind, cassette, api)
        target, override, to_backend = routed(self, kwargs.get("model"), api)
        with one_call(api.provider, kwargs, api.request, for_backend if to_backend else None) as call:
            resp = orig(target, *args, **({**call.kwargs, **override} if override else call.kwargs))
        if call.rec is not None:
            _record(call, api, resp, is_async=False)
        return resp

    return call


def _wrap_async(orig: Callable[..., Any], kind: str, api: API) -> Callable[..., Any]:
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return await orig(self, *args, **kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return replayed(self, kwargs, kind, cassette, api)
        target, override, to_backend = routed(self, kwargs.get("model"), api)
        with one_call(api.provider, kwargs, api.request, for_backend if to_backend else None) as call:
            resp = await orig(target, *args, **({**call.kwargs, **override} if override else call.kwargs))
        if call.rec is not None:
            _record(call, api, resp, is_async=True)
        return resp

    return call


def _record(call: one_call, api: API, resp: Any, *, is_async: bool) -> None:
    rec, slot, kwargs, sent, t0 = call.rec, call.slot, call.kwargs, call.sent, call.t0
    headers = kwargs.get("extra_headers")  # with_raw_response / with_streaming_response say so in a header
    if headers and headers.get(_RAW_HEADER) is not None and hasattr(resp, "http_response"):
        _watch_raw(rec, slot, api, kwargs, sent, resp.http_response, t0)
    elif kwargs.get("stream") is True:
        def from_bytes(body: bytes, complete: bool) -> LLMCall:
            return _from_body(api, kwargs, sent, resp.response, body, complete, perf_counter() - t0)

        watch_stream(rec, slot, api.accumulator(kwargs, sent), resp, t0, is_async, from_bytes)
    else:
        rec.fill(slot, api.from_response(kwargs, resp, perf_counter() - t0, request=sent))


def _watch_raw(rec: Recorder, slot: int, api: API, kwargs: dict[str, Any], sent: Any, http_response: Any,
               t0: float) -> None:
    """A raw-response wrapper: the agent reads the body as it likes; the call is recorded
    from the bytes once they are all in (or from what came, if the rollout ends first), with
    the request as it was sent (``sent``)."""
    def done(body: bytes, complete: bool) -> None:
        rec.fill(slot, _from_body(api, kwargs, sent, http_response, body, complete, perf_counter() - t0))

    partial = http_body.watch_body(http_response, done)
    rec.on_close(slot, partial)


def _from_body(api: API, kwargs: dict[str, Any], sent: Any, http_response: Any, body: bytes, complete: bool,
               latency: float) -> LLMCall:
    if http_body.is_event_stream(http_response):
        acc = api.accumulator(kwargs, sent)
        events, _ = http_body.sse_events(body)
        for data in events:
            acc.add(api.parse_event(data))
        return acc.to_call(latency, left_early=not complete)
    data = http_body.json_body(body)
    if complete and isinstance(data, dict):
        try:
            return api.from_response(kwargs, api.parse_body(data), latency, request=sent)
        except ValueError:
            pass
    problem = "the response body was not read to its end" if not complete else "the response body is not the API's JSON"
    call = failed_call(api.provider, kwargs, ValueError(problem), latency, sent)
    call.incomplete = not complete
    return call


def watch_stream(rec: Recorder, slot: int, acc: Any, stream: Any, t0: float, is_async: bool,
                 from_bytes: Optional[Callable[[bytes, bool], LLMCall]] = None) -> None:
    """Record the stream the agent iterates without changing it: the chunks pass through
    untouched, and the assembled call is recorded when the stream ends, is closed, is left
    early, or when the rollout finishes first. An agent that reads the bytes underneath
    instead (``stream.response.iter_bytes()``) is recorded from those (``from_bytes``).

    Chunks are kept as they pass and read into the accumulator ``READ_EVERY`` at a time (and
    at the end): read one at a time, between the client's own work on the next, the reading
    code runs cold each time and costs several times what it costs in a loop over many. So a
    chunk is read as the agent left it: one the agent changes in place is recorded changed."""
    done, seen, iterating = False, False, False  # seen: a chunk has passed (read or kept)
    recorded = False  # the call is made: chunks read on after that are not added (its lists are the call's)
    body: dict[str, Any] = {}
    kept: list[Any] = []  # chunks passed on and not yet read
    reading = threading.Lock()  # the rollout can end (and read) on another thread while the agent reads
    partial = None
    if from_bytes is not None and getattr(stream, "response", None) is not None:
        # the bytes are kept only if the agent reads them itself: the stream's own iteration
        # reads them too, and its chunks are recorded as they pass
        partial = http_body.watch_body(stream.response, lambda data, complete: body.update(data=data, complete=complete),
                                       recorded_otherwise=lambda: iterating)

    def read() -> None:
        nonlocal seen
        with reading:
            seen = seen or bool(kept)
            if not recorded:
                for chunk in kept:
                    acc.add(chunk)
            kept.clear()

    def finish(left_early: bool, failure: Optional[str] = None) -> None:
        nonlocal done, recorded
        if not done:
            done = True
            vars(stream).pop("close", None)  # (it refers to the stream: a cycle for the collector)
            if not seen and not kept and from_bytes is not None and partial is not None:
                if "data" not in body:
                    partial()  # what arrived so far
                if body.get("data"):
                    rec.fill(slot, from_bytes(body["data"], body["complete"]))
                    return
            read()
            with reading:
                recorded = True
                call = acc.to_call(perf_counter() - t0, left_early, failure)
            rec.fill(slot, call)

    rec.on_close(slot, lambda: finish(True))
    inner = stream._iterator
    orig_close = stream.close
    keep = kept.append

    if is_async:
        async def agen() -> Any:
            nonlocal iterating
            iterating = True
            complete, failure = False, None
            try:
                async for chunk in inner:
                    keep(chunk)
                    if len(kept) >= READ_EVERY:
                        read()
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
            nonlocal iterating
            iterating = True
            complete, failure = False, None
            try:
                for chunk in inner:
                    keep(chunk)
                    if len(kept) >= READ_EVERY:
                        read()
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


def replayed(resource: Any, kwargs: dict[str, Any], kind: str, cassette: Cassette, api: API) -> Any:
    """The next recorded call of the replay's cassette, as the client would have returned it."""
    model, messages, tools, _ = api.request(kwargs)
    call = cassette.next_call(model, messages, tools)
    rec = current_recorder.get()
    if rec is not None:
        rec.add(call.model_copy(deep=True))
    return api.replay(resource, kwargs, kind, call)


def replay_stream(resource: Any, item_type: type, events: list[dict[str, Any]], path: str) -> Any:
    """A Stream (or AsyncStream) of ``item_type`` that yields ``events``, as the client
    would build one from the network."""
    from openai import AsyncStream, Stream

    from .openai_http import http

    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    response = http().Response(200, content=body.encode(), headers={"content-type": "text/event-stream"},
                               request=http().Request("POST", f"http://replay.invalid/{path}"))
    cls = AsyncStream if type(resource).__name__.startswith("Async") else Stream
    return cls(cast_to=item_type, response=response, client=resource._client)
