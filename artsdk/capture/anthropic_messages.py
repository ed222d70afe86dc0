"""Capture for the ``anthropic`` client's Messages API: ``messages.create`` (plain and
``stream=True``) and ``messages.stream()`` on ``Anthropic`` and ``AsyncAnthropic``, and the same
under ``client.beta.messages``, through the raw-response wrappers too (LangChain's
``ChatAnthropic`` calls ``messages.with_raw_response.create``). The client is built like the openai one, so the machinery is
``openai_patch.py``; what is particular to the Messages API is here and in
``messages_record.py``.

``messages.stream()`` hands back a manager that sends its request only when entered (``with
client.messages.stream(...) as stream``): the request it would send is swapped for one made the
captured way -- recorded, routed to the backend in a session, answered from the recording in a
replay -- when it is entered, so the call takes its place among the rollout's calls then.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from functools import partial
from typing import Any, Callable

from ..trajectory.records import LLMCall
from . import context
from .cassette import current_cassette
from .context import for_backend, one_call
from .messages_record import MessagesStreamAccumulator, events_from_call, from_response, message_from_call
from .messages_record import messages_request
from .openai_patch import API, replayed, routed, watch_stream
from .openai_patch import patch as patch_api
from .openai_patch import unpatch as unpatch_api

PROVIDER = "anthropic"


def _classes() -> tuple[type, type]:
    from anthropic.resources.messages import AsyncMessages, Messages

    return Messages, AsyncMessages


def _beta_classes() -> tuple[type, type]:
    from anthropic.resources.beta.messages import AsyncMessages, Messages

    return Messages, AsyncMessages


def _built_as(type_name: str) -> Callable[[Any], Any]:
    """JSON -> the anthropic type ``module:Name``, built leniently, as the client builds what it
    receives."""
    def build(data: Any) -> Any:
        from anthropic._models import construct_type

        module, name = type_name.split(":")
        return construct_type(type_=getattr(importlib.import_module(module), name), value=data)

    return build


def _replay(resource: Any, kwargs: dict[str, Any], kind: str, call: LLMCall) -> Any:
    """The recorded answer as the client would have returned it: a Message, or a stream of
    events."""
    if kwargs.get("stream") is True or kind == "stream":
        return _replay_stream(resource, call)
    return _built_as("anthropic.types:Message")(message_from_call(call))


def _replay_stream(resource: Any, call: LLMCall) -> Any:
    import anthropic._base_client as base
    from anthropic import AsyncStream, Stream
    from anthropic.types import RawMessageStreamEvent

    # the HTTP library the client is built on: httpx2 for anthropic 2.x, httpx before
    library = base.httpx2 if hasattr(base, "httpx2") else importlib.import_module("httpx")
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events_from_call(call))
    response = library.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"},
                                request=library.Request("POST", "http://replay.invalid/v1/messages"))
    cls = AsyncStream if type(resource).__name__.startswith("Async") else Stream
    return cls(cast_to=RawMessageStreamEvent, response=response, client=resource._client)


MESSAGES = API(provider=PROVIDER, path="messages", classes=_classes, methods=("create",),
               request=messages_request, from_response=partial(from_response, PROVIDER),
               accumulator=partial(MessagesStreamAccumulator, PROVIDER),
               parse_body=_built_as("anthropic.types:Message"),
               parse_event=_built_as("anthropic.types:RawMessageStreamEvent"), replay=_replay,
               base_url=lambda url: url.rstrip("/").removesuffix("/v1"))  # its paths start with /v1
# client.beta.messages: the same API with beta features switched on by name (``betas=[...]``)
BETA_MESSAGES = dataclasses.replace(MESSAGES, path="beta.messages", classes=_beta_classes)


def patch(module: Any, *apis: API) -> None:
    """Wrap ``create`` (the machinery of ``openai_patch.py``) and ``stream`` of each of
    ``apis`` (idempotent)."""
    patch_api(module, *apis)
    for api in apis:
        for cls, is_async in zip(api.classes(), (False, True)):
            orig = cls.__dict__.get("stream")
            if orig is None or getattr(orig, "__artsdk_wrapped__", False):
                continue
            wrapper = _wrap_stream(orig, api, is_async)
            wrapper.__artsdk_wrapped__ = True  # type: ignore[attr-defined]
            wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
            wrapper.__name__, wrapper.__doc__ = "stream", orig.__doc__
            cls.stream = wrapper


def unpatch(module: Any, *apis: API) -> None:
    unpatch_api(module, *apis)
    for api in apis:
        for cls in api.classes():
            fn = cls.__dict__.get("stream")
            if getattr(fn, "__artsdk_wrapped__", False):
                cls.stream = fn.__wrapped__


def _wrap_stream(orig: Callable[..., Any], api: API, is_async: bool) -> Callable[..., Any]:
    """``messages.stream(...)``: the manager the client builds (it checks the arguments), its
    request swapped for a captured one."""
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        manager = orig(self, *args, **kwargs)
        if not context.active():
            return manager
        slot_name = f"_{type(manager).__name__}__api_request"  # the request the manager sends when entered
        if not hasattr(manager, slot_name):
            return manager
        stream_kwargs = {**kwargs, "stream": True}

        def sent(target: Any, send: dict[str, Any]) -> Any:
            """The request the client's own manager would make, for ``send`` to ``target``."""
            return getattr(orig(target, *args, **{k: v for k, v in send.items() if k != "stream"}), slot_name)

        if is_async:
            getattr(manager, slot_name).close()  # never sent: this one is

            async def request() -> Any:
                cassette = current_cassette.get()
                if cassette is not None:
                    return replayed(self, stream_kwargs, "stream", cassette, api)
                target, override, to_backend = routed(self, kwargs.get("model"), api)
                with one_call(api.provider, stream_kwargs, api.request) as call:
                    send = for_backend(kwargs, call.slot) if to_backend else kwargs
                    raw = await sent(target, {**send, **override} if override else send)
                if call.rec is not None:
                    watch_stream(call.rec, call.slot, api.accumulator(stream_kwargs, call.sent), raw, call.t0, True)
                return raw

            setattr(manager, slot_name, request())
        else:
            def request_sync() -> Any:
                cassette = current_cassette.get()
                if cassette is not None:
                    return replayed(self, stream_kwargs, "stream", cassette, api)
                target, override, to_backend = routed(self, kwargs.get("model"), api)
                with one_call(api.provider, stream_kwargs, api.request) as call:
                    send = for_backend(kwargs, call.slot) if to_backend else kwargs
                    raw = sent(target, {**send, **override} if override else send)()
                if call.rec is not None:
                    watch_stream(call.rec, call.slot, api.accumulator(stream_kwargs, call.sent), raw, call.t0, False)
                return raw

            setattr(manager, slot_name, request_sync)
        return manager

    return call
