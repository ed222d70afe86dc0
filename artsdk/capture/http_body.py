"""Recording a call from the bytes of its HTTP response, for the client wrappers that hand
agent code the raw response (``with_raw_response``, ``with_streaming_response``): the body
is read by the agent however it likes (``.parse()``, ``iter_lines()``, ``iter_bytes()``,
``read()``...), and every one of those reads the response's byte stream -- which is where
the bytes are kept, untouched, on their way through. When the body ends (or is closed, or
the rollout ends first) the bytes are decoded: a JSON body, or server-sent events.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, AsyncIterator, Callable, Iterator, Optional

Done = Callable[[bytes, bool], None]  # (the body so far, whether it arrived whole)


def watch_body(http_response: Any, done: Done,
               recorded_otherwise: Callable[[], bool] = lambda: False) -> Callable[[], None]:
    """Call ``done`` once with the body of ``http_response`` (an httpx2 / httpx response),
    now if it was read already, else when the reader finishes it. Returns a function that
    reports what arrived so far (for a rollout that ends before the body does).
    ``recorded_otherwise``: asked when the body starts to be read; if it says the reading is
    recorded another way (a stream's own chunks), the bytes pass without being kept."""
    # ``done`` is let go of once called: it may refer to the response, whose stream refers to
    # this (a cycle that would leave the response to the garbage collector)
    state: dict[str, Any] = {"done": done, "parts": []}

    def finish(complete: bool) -> None:
        called = state.pop("done", None)
        if called is not None:
            called(b"".join(state["parts"]), complete)

    if getattr(http_response, "_content", None) is not None:  # already read
        state["parts"].append(http_response._content)
        finish(True)
        return lambda: None
    inner = http_response.stream
    library = sys.modules[type(http_response).__module__.partition(".")[0]]  # httpx or httpx2, whichever built it
    sync_tee, async_tee = _tees(library)
    if isinstance(inner, library.AsyncByteStream) or hasattr(inner, "__aiter__"):
        http_response.stream = async_tee(inner, state["parts"], finish, recorded_otherwise)
    else:
        http_response.stream = sync_tee(inner, state["parts"], finish, recorded_otherwise)
    return lambda: finish(False)


class _SyncTee:
    """The response's byte stream, passed through, its chunks kept (made a subclass of the
    HTTP library's SyncByteStream by ``_tees``: httpx checks the type before reading) --
    unless the reading is recorded otherwise: then passed through as it is, at no cost a chunk."""

    def __init__(self, inner: Any, parts: list[bytes], finish: Callable[[bool], None],
                 recorded_otherwise: Callable[[], bool]) -> None:
        self.inner, self.parts, self.finish, self.recorded_otherwise = inner, parts, finish, recorded_otherwise

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.inner) if self.recorded_otherwise() else self._kept()

    def _kept(self) -> Iterator[bytes]:
        complete = False
        try:
            for chunk in self.inner:
                self.parts.append(chunk)
                yield chunk
            complete = True
        finally:
            self.finish(complete)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.finish(False)


class _AsyncTee:
    """The same for an async byte stream (an AsyncByteStream subclass, by ``_tees``)."""

    def __init__(self, inner: Any, parts: list[bytes], finish: Callable[[bool], None],
                 recorded_otherwise: Callable[[], bool]) -> None:
        self.inner, self.parts, self.finish, self.recorded_otherwise = inner, parts, finish, recorded_otherwise

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.inner.__aiter__() if self.recorded_otherwise() else self._kept()

    async def _kept(self) -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in self.inner:
                self.parts.append(chunk)
                yield chunk
            complete = True
        finally:
            self.finish(complete)

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.finish(False)


@functools.lru_cache(maxsize=None)
def _tees(module: Any) -> tuple[type, type]:
    return (type("SyncTee", (_SyncTee, module.SyncByteStream), {}),
            type("AsyncTee", (_AsyncTee, module.AsyncByteStream), {}))


def sse_events(body: bytes) -> tuple[list[Any], bool]:
    """The JSON ``data:`` payloads of a server-sent-events body, and whether it ended with
    ``[DONE]``. Incomplete trailing events are dropped."""
    events, ended = [], False
    for block in body.decode("utf-8", "replace").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.splitlines() if line.startswith("data:"))
        if not data:
            continue
        if data.strip() == "[DONE]":
            ended = True
            continue
        try:
            events.append(json.loads(data))
        except ValueError:
            break  # cut in the middle of an event
    return events, ended


def is_event_stream(http_response: Any) -> bool:
    return "text/event-stream" in (http_response.headers.get("content-type") or "")


def json_body(body: bytes) -> Optional[Any]:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None
