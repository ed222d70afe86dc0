"""Capture for ``litellm``: ``completion`` and ``acompletion``, plain and streamed.

litellm is patched only when the user's code imports it (see ``capture.install``); artsdk
itself never imports it. A litellm call that goes through the openai client underneath is
recorded once, here.
"""

from __future__ import annotations

import functools
from time import perf_counter
from typing import Any, Callable, Optional

from . import context
from .context import Recorder, current_cassette, current_recorder, hint_misspelt_model, inside_call, route_for
from .record import (
    StreamAccumulator,
    chunks_from_call,
    failed_call,
    from_response,
    request_parts,
    response_from_call,
)

_STREAM_ATTR = "_artsdk_watch"


def patch(module: Any) -> None:
    """Wrap ``litellm.completion`` / ``litellm.acompletion`` and teach litellm's stream
    wrapper to report what it yields (idempotent)."""
    for name, is_async in (("completion", False), ("acompletion", True)):
        orig = getattr(module, name, None)
        if orig is None or getattr(orig, "__artsdk_wrapped__", False):
            continue
        wrapper = _wrap_async(orig) if is_async else _wrap_sync(orig)
        wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
        setattr(module, name, wrapper)
    _patch_stream_class()


def unpatch(module: Any) -> None:
    for name in ("completion", "acompletion"):
        fn = getattr(module, name, None)
        if getattr(fn, "__artsdk_wrapped__", False):
            setattr(module, name, fn.__wrapped__)


def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    # litellm.completion(model, messages, ...) is also called positionally
    return {**dict(zip(("model", "messages"), args)), **kwargs} if args else kwargs


def _route(kwargs: dict[str, Any]) -> dict[str, Any]:
    found = route_for(kwargs.get("model"))
    if found is None:
        return kwargs
    route, send_as = found
    return {**kwargs, "model": f"openai/{send_as}", "api_base": route.base_url, "api_key": route.api_key}


def _wrap_sync(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def completion(*args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return orig(*args, **kwargs)
        kwargs = _named(args, kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(kwargs, cassette, is_async=False)
        rec = current_recorder.get()
        token = inside_call.set(True)
        t0 = perf_counter()
        try:
            resp = orig(**_route(kwargs))
        except BaseException as exc:
            if rec is not None:
                rec.add(failed_call("litellm", kwargs, exc, perf_counter() - t0))
            hint_misspelt_model(exc, kwargs.get("model"))
            raise
        finally:
            inside_call.reset(token)
        if rec is not None:
            _record(rec, kwargs, resp, t0)
        return resp

    return completion


def _wrap_async(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def acompletion(*args: Any, **kwargs: Any) -> Any:
        if not context.active():
            return await orig(*args, **kwargs)
        kwargs = _named(args, kwargs)
        cassette = current_cassette.get()
        if cassette is not None:
            return _replay(kwargs, cassette, is_async=True)
        rec = current_recorder.get()
        token = inside_call.set(True)
        t0 = perf_counter()
        try:
            resp = await orig(**_route(kwargs))
        except BaseException as exc:
            if rec is not None:
                rec.add(failed_call("litellm", kwargs, exc, perf_counter() - t0))
            hint_misspelt_model(exc, kwargs.get("model"))
            raise
        finally:
            inside_call.reset(token)
        if rec is not None:
            _record(rec, kwargs, resp, t0)
        return resp

    return acompletion


def _record(rec: Recorder, kwargs: dict[str, Any], resp: Any, t0: float) -> None:
    if kwargs.get("stream") is True:
        _StreamWatch(rec, kwargs, t0).attach(resp)
    else:
        rec.add(from_response("litellm", kwargs, resp, perf_counter() - t0))


class _StreamWatch:
    """Assembles one litellm stream; the patched stream class feeds it each chunk."""

    def __init__(self, rec: Recorder, kwargs: dict[str, Any], t0: float) -> None:
        self.rec = rec
        self.acc = StreamAccumulator("litellm", kwargs)
        self.t0 = t0
        self.done = False
        self.slot = rec.reserve(lambda: self.finish(True))

    def attach(self, stream: Any) -> None:
        setattr(stream, _STREAM_ATTR, self)

    def finish(self, left_early: bool, failure: Optional[str] = None) -> None:
        if not self.done:
            self.done = True
            self.rec.fill(self.slot, self.acc.to_call(perf_counter() - self.t0, left_early, failure))


def _patch_stream_class() -> None:
    from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper as W

    if getattr(W, "__artsdk_wrapped__", False):
        return
    orig_next, orig_anext, orig_close, orig_aclose = W.__next__, W.__anext__, W.close, W.aclose

    def __next__(self: Any) -> Any:
        watch = self.__dict__.get(_STREAM_ATTR)
        if watch is None:
            return orig_next(self)
        try:
            chunk = orig_next(self)
        except StopIteration:
            watch.finish(False)
            raise
        except Exception as e:
            watch.finish(False, f"{type(e).__name__}: {e}")
            raise
        watch.acc.add(chunk)
        return chunk

    async def __anext__(self: Any) -> Any:
        watch = self.__dict__.get(_STREAM_ATTR)
        if watch is None:
            return await orig_anext(self)
        try:
            chunk = await orig_anext(self)
        except StopAsyncIteration:
            watch.finish(False)
            raise
        except Exception as e:
            watch.finish(False, f"{type(e).__name__}: {e}")
            raise
        watch.acc.add(chunk)
        return chunk

    def close(self: Any) -> None:
        try:
            orig_close(self)
        finally:
            watch = self.__dict__.get(_STREAM_ATTR)
            if watch is not None:
                watch.finish(True)

    async def aclose(self: Any) -> None:
        try:
            await orig_aclose(self)
        finally:
            watch = self.__dict__.get(_STREAM_ATTR)
            if watch is not None:
                watch.finish(True)

    W.__next__, W.__anext__, W.close, W.aclose = __next__, __anext__, close, aclose  # type: ignore[method-assign]
    W.__artsdk_wrapped__ = True  # type: ignore[attr-defined]


class _ReplayStream:
    """A recorded call replayed as a litellm stream (sync or async iteration)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = iter(chunks)

    def __iter__(self) -> "_ReplayStream":
        return self

    def __next__(self) -> Any:
        return next(self._chunks)

    def __aiter__(self) -> "_ReplayStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    def __enter__(self) -> "_ReplayStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "_ReplayStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._chunks = iter(())

    async def aclose(self) -> None:
        self.close()


def _replay(kwargs: dict[str, Any], cassette: context.Cassette, *, is_async: bool) -> Any:
    import litellm

    model, messages, tools, _ = request_parts(kwargs)
    call = cassette.next_call(model, messages, tools)
    rec = current_recorder.get()
    if rec is not None:
        rec.add(call.model_copy(deep=True))
    if kwargs.get("stream") is True:
        return _ReplayStream([litellm.ModelResponseStream(**c) for c in chunks_from_call(call)])
    return litellm.ModelResponse(**response_from_call(call))
