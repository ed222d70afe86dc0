"""The machinery that captures ``litellm``'s functions: each is wrapped so that, inside a
rollout, its calls are recorded (plain and streamed), routed to the backend during a
session, and answered from the recording during a replay. What differs from one function
pair to the next (``completion`` in ``litellm.py``, ``responses`` in ``litellm_responses.py``)
is a ``Kind``; ``capture/__init__.py`` lists them.

litellm is patched only when the user's code imports it (see ``capture.install``); artsdk
itself never imports it. A litellm call that goes through the openai client underneath is
recorded once, here; a call one of litellm's logging callbacks makes is a call of its own
(``litellm_callbacks.py``).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Optional

from ..trajectory.records import LLMCall
from . import context, litellm_callbacks
from .cassette import Cassette, current_cassette
from .context import Recorder, current_recorder, for_backend, one_call, route_for

_STREAM_ATTR = "_artsdk_watch"


@dataclass(frozen=True)
class Kind:
    """What differs between the litellm functions artsdk captures."""

    provider: str
    functions: tuple[str, str]  # (sync name, async name) in the litellm module
    positional: tuple[str, ...]  # names of the positional arguments
    request: Callable[[dict[str, Any]], tuple[str, list[dict[str, Any]], Any, dict[str, Any]]]
    from_response: Callable[..., LLMCall]  # (kwargs, response, latency, request=what request(kwargs) gave)
    accumulator: Callable[[dict[str, Any], Any], Any]  # (kwargs, the request as sent)
    replay: Callable[[dict[str, Any], LLMCall], Any]  # what litellm would have returned
    patch_streams: Callable[[], None]  # teach the stream class(es) to report what they yield


def patch(module: Any, *kinds: Kind) -> None:
    """Wrap each of ``kinds``' functions in litellm and teach its stream classes to report
    what they yield (idempotent)."""
    for kind in kinds:
        for name, is_async in zip(kind.functions, (False, True)):
            orig = getattr(module, name, None)
            if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                continue
            wrapper = _wrap_async(orig, kind) if is_async else _wrap_sync(orig, kind)
            wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
            setattr(module, name, wrapper)
        kind.patch_streams()
    litellm_callbacks.patch()


def unpatch(module: Any, *kinds: Kind) -> None:
    """Put back the functions ``patch`` wrapped."""
    for kind in kinds:
        for name in kind.functions:
            fn = getattr(module, name, None)
            if getattr(fn, "__artsdk_wrapped__", False):
                setattr(module, name, fn.__wrapped__)
    litellm_callbacks.unpatch()


def _route(kwargs: dict[str, Any], slot: int) -> dict[str, Any]:
    found = route_for(kwargs.get("model"))
    if found is None:
        return kwargs
    route, send_as = found
    return {**for_backend(kwargs, slot), "model": f"openai/{send_as}", "api_base": route.base_url,
            "api_key": route.api_key}


def _wrap_sync(orig: Callable[..., Any], kind: Kind) -> Callable[..., Any]:
    @functools.wraps(orig)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return orig(*args, **kwargs)
        kwargs = {**dict(zip(kind.positional, args)), **kwargs}  # litellm's functions are called positionally too
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(kwargs, cassette, kind)
        with one_call(kind.provider, kwargs, kind.request) as call:
            resp = orig(**_route(call.kwargs, call.slot))
        if call.rec is not None:
            _record(call, kind, resp)
        return resp

    return call


def _wrap_async(orig: Callable[..., Any], kind: Kind) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def call(*args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return await orig(*args, **kwargs)
        kwargs = {**dict(zip(kind.positional, args)), **kwargs}
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(kwargs, cassette, kind)
        with one_call(kind.provider, kwargs, kind.request) as call:
            resp = await orig(**_route(call.kwargs, call.slot))
        if call.rec is not None:
            _record(call, kind, resp)
        return resp

    return call


def _record(call: one_call, kind: Kind, resp: Any) -> None:
    """The call recorded with the request as it was sent (``call.sent``, read before it went out)."""
    if call.kwargs.get("stream") is True:
        StreamWatch(call.rec, call.slot, kind.accumulator(call.kwargs, call.sent), call.t0).attach(resp)
    else:
        call.rec.fill(call.slot, kind.from_response(call.kwargs, resp, perf_counter() - call.t0, request=call.sent))


class StreamWatch:
    """Assembles one litellm stream; the patched stream class feeds it each chunk. The rollout
    can end (and record the call) while the agent is inside the stream waiting for a chunk, on
    another thread or task: a chunk that arrives after that is passed on and not added."""

    def __init__(self, rec: Recorder, slot: int, acc: Any, t0: float) -> None:
        self.rec = rec
        self.acc = acc
        self.t0 = t0
        self.done = False
        self.slot = slot
        self._lock = threading.Lock()
        rec.on_close(slot, lambda: self.finish(True))

    def attach(self, stream: Any) -> None:
        setattr(stream, _STREAM_ATTR, self)

    def add(self, chunk: Any) -> None:
        lock = self._lock
        if lock is None:  # finished
            return
        with lock:
            if not self.done:
                self.acc.add(chunk)

    def finish(self, left_early: bool, failure: Optional[str] = None) -> None:
        lock = self._lock
        if lock is None:
            return
        with lock:
            if self.done:
                return
            self.done = True
            call = self.acc.to_call(perf_counter() - self.t0, left_early, failure)
        rec = self.rec
        # the stream keeps this until it goes, and litellm's streams are freed by the garbage
        # collector (a cycle of their own): neither the recording nor the lock is held there with
        # them (a lock in that cycle was one more object a call left to the collector)
        self.rec = self.acc = self._lock = None
        rec.fill(self.slot, call)


def watch_stream_class(sync_cls: type, async_cls: type) -> None:
    """Patch a litellm stream class (or a sync and an async one) so that a stream carrying a
    StreamWatch reports each item, its end, its failure and its closing (idempotent)."""
    if not getattr(sync_cls, "__artsdk_wrapped__", False):
        orig_next, orig_close = sync_cls.__next__, getattr(sync_cls, "close", None)

        def __next__(self: Any) -> Any:
            watch = self.__dict__.get(_STREAM_ATTR)
            if watch is None or watch.done:  # (a stream read on after the rollout ended)
                return orig_next(self)
            try:
                chunk = orig_next(self)
            except StopIteration:
                watch.finish(False)
                raise
            except Exception as e:
                watch.finish(False, f"{type(e).__name__}: {e}")
                raise
            watch.add(chunk)
            return chunk

        def close(self: Any) -> None:
            try:
                if orig_close is not None:
                    orig_close(self)
            finally:
                watch = self.__dict__.get(_STREAM_ATTR)
                if watch is not None:
                    watch.finish(True)

        sync_cls.__next__, sync_cls.close = __next__, close  # type: ignore[method-assign]
        sync_cls.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
    if getattr(async_cls, "__artsdk_wrapped_async__", False):
        return
    orig_anext, orig_aclose = async_cls.__anext__, getattr(async_cls, "aclose", None)

    async def __anext__(self: Any) -> Any:
        watch = self.__dict__.get(_STREAM_ATTR)
        if watch is None or watch.done:  # (a stream read on after the rollout ended)
            return await orig_anext(self)
        try:
            chunk = await orig_anext(self)
        except StopAsyncIteration:
            watch.finish(False)
            raise
        except Exception as e:
            watch.finish(False, f"{type(e).__name__}: {e}")
            raise
        watch.add(chunk)
        return chunk

    async def aclose(self: Any) -> None:
        try:
            if orig_aclose is not None:
                await orig_aclose(self)
        finally:
            watch = self.__dict__.get(_STREAM_ATTR)
            if watch is not None:
                watch.finish(True)

    async_cls.__anext__, async_cls.aclose = __anext__, aclose  # type: ignore[method-assign]
    async_cls.__artsdk_wrapped_async__ = True  # type: ignore[attr-defined]


class ReplayStream:
    """Recorded items replayed as a litellm stream (sync or async iteration)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = iter(chunks)

    def __iter__(self) -> "ReplayStream":
        return self

    def __next__(self) -> Any:
        return next(self._chunks)

    def __aiter__(self) -> "ReplayStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    def __enter__(self) -> "ReplayStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "ReplayStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._chunks = iter(())

    async def aclose(self) -> None:
        self.close()


def _replay(kwargs: dict[str, Any], cassette: Cassette, kind: Kind) -> Any:
    model, messages, tools, _ = kind.request(kwargs)
    call = cassette.next_call(model, messages, tools)
    rec = current_recorder.get()
    if rec is not None:
        rec.add(call.model_copy(deep=True))
    return kind.replay(kwargs, call)
