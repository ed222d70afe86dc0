"""From the fields of an inference request to a generation on the engine, for every route
of the local server (chat completions, the Responses API): the model and step a request
names, its prompt through the chat template, the answer's budget, and the submission,
pinned to its step until it is answered."""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any, AsyncIterator, Callable, Optional

from artsdk.errors import TrajectoryError

from .engine import Request as GenRequest
from .served import ServedModel

MAX_BODY = 16 * 1024 * 1024
DEFAULT_MAX_TOKENS = 1024
MAX_TOKENS_LIMIT = 1_000_000
_STEP = re.compile(r"[0-9]{1,9}")


class BadRequest(Exception):
    """A request this server will not run as sent: answered with ``status`` (400) and a
    message naming ``param``, the field at fault."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


async def prepare(served: ServedModel, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]],
                  where: str, *, max_tokens: int, **sampling: Any) -> GenRequest:
    """A generation request for a conversation: its prompt through the chat template, the
    answer's budget cut to what the context leaves. BadRequest (naming ``where``) when the
    messages are not valid text, do not render or do not fit.

    Cheap checks come first, on the event loop: text that is not valid Unicode is refused by
    where it is, and a conversation that cannot fit whatever its tokens (more messages than
    the context has tokens, or more characters than it holds tokens times the longest token)
    is refused before any rendering. Rendering and tokenising then run on a worker thread, so
    a big request never stalls the server's other requests."""
    chars = _text_size(messages, where) + (_text_size(tools, "tools") if tools else 0)
    limit = served.context_length
    if len(messages) > limit or chars > limit * served.chat.max_token_chars:
        raise BadRequest(f"the conversation ({len(messages)} messages, {chars} characters) cannot fit the model's "
                         f"context of {limit} tokens; shorten it", where, status=400)
    prompt = await asyncio.to_thread(_render, served, messages, tools, where)
    room = served.context_length - len(prompt)
    if room <= 0:
        raise BadRequest(f"the prompt is {len(prompt)} tokens, longer than the model's context of "
                         f"{served.context_length}; shorten the conversation", where)
    return GenRequest(prompt=prompt, max_tokens=min(max_tokens, room), **sampling)


def _render(served: ServedModel, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]],
            where: str) -> list[int]:
    try:  # earlier answers this server gave go in as the tokens it sampled (continuation.py)
        return served.continuations.prompt_ids(messages, tools)[0]
    except TrajectoryError as e:
        raise BadRequest(str(e), where) from None


def _text_size(value: Any, where: str) -> int:
    """The characters of every string in ``value``; BadRequest naming the first that is not
    valid Unicode (a lone surrogate, sent as ``"\\ud800"``), which no tokenizer can take."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadRequest(f"{where} holds {value[e.start]!r} at character {e.start}, a lone surrogate: not "
                                 f"valid Unicode text; send the text as UTF-8", where) from None
        return len(value)
    if isinstance(value, dict):
        for k in value:  # keys are not rendered as text, but must be text all the same
            _text_size(k, where)
        return sum(_text_size(v, f"{where}.{k}") for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_text_size(v, f"{where}[{i}]") for i, v in enumerate(value))
    return 0


async def answer(request: Any, future: Any, req: GenRequest) -> Any:
    """The engine's answer to ``req``; if the client goes away first, its generation is
    cancelled (within a token) and ClientGone raised."""
    waiting = asyncio.ensure_future(asyncio.wrap_future(future))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiting.done():
        return waiting.result()
    req.cancelled = True
    waiting.cancel()
    raise ClientGone()


async def _disconnected(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def cancel_when_left(stream: Callable[..., AsyncIterator[str]]) -> Callable[..., AsyncIterator[str]]:
    """A streamed answer's event generator (its second argument the GenRequest) that cancels
    the generation when it stops early: the client went away (the server then closes it), so
    the engine stops within a token instead of generating to max_tokens for nobody."""
    @functools.wraps(stream)
    async def wrapped(served: Any, req: GenRequest, *args: Any, **kwargs: Any) -> AsyncIterator[str]:
        ended = False
        try:
            async for event in stream(served, req, *args, **kwargs):
                yield event
            ended = True
        finally:
            if not ended:
                req.cancelled = True

    return wrapped


def resolve(models: dict[str, ServedModel], requested: str) -> tuple[ServedModel, Optional[int]]:
    """The model a request names and the step it asks for (None: the newest when submitted)."""
    name, at, step_text = requested.partition("@")
    served = models.get(name)
    if served is None:
        known = ", ".join(sorted(models)) or "none registered"
        raise BadRequest(f"unknown model {requested[:100]!r}; this server has: {known}", "model")
    if not at:
        return served, None
    if not _STEP.fullmatch(step_text) or int(step_text) not in served.serving:
        raise BadRequest(f"{requested[:100]!r}: step {step_text[:20]} is not being served "
                         f"(serving {sorted(served.serving)}); ask for {name!r} for the newest", "model")
    return served, int(step_text)


def submit_streaming(served: ServedModel, req: GenRequest, step: Optional[int]) -> tuple[Any, "asyncio.Queue[Any]"]:
    """``submit`` for a streamed answer: (the future, a queue that receives each sampled
    token as (choice index, token id, logprob, new text), then None when generation ends)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()
    req.on_token = lambda *ev: loop.call_soon_threadsafe(events.put_nowait, ev)
    future = submit(served, req, step)
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, None))
    return future, events


def submit(served: ServedModel, req: GenRequest, step: Optional[int]) -> Any:
    """Hand the request to the engine, pinned to its step until it is answered."""
    try:
        return served.submit(req, step)
    except ValueError as e:  # the step asked for was retired since it was checked
        raise BadRequest(f"{served.spec.name}@{step}: {e}; ask for {served.spec.name!r} for the newest",
                         "model") from None


def logprob_content(served: ServedModel, ids: list[int], lps: list[float]) -> list[dict[str, Any]]:
    return [{"token": served.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, lps)]


