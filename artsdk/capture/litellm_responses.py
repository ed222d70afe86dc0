"""Capture for litellm's Responses API: ``responses`` and ``aresponses``, plain and
streamed, through the machinery of ``litellm_patch.py``; items and the chat view as for the
openai client's Responses API (``responses_record.py``)."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..trajectory.records import LLMCall
from .litellm_patch import Kind, ReplayStream, watch_stream_class
from .openai_patch import built_as
from .responses_record import ResponsesStreamAccumulator, events_from_call, from_response, response_from_call
from .responses_record import responses_request

PROVIDER = "litellm-responses"


def _replay(kwargs: dict[str, Any], call: LLMCall) -> Any:
    if kwargs.get("stream") is True:
        event = built_as("openai.types.responses:ResponseStreamEvent")
        return ReplayStream([event(e) for e in events_from_call(call)])
    return built_as("openai.types.responses:Response")(response_from_call(call))


def _patch_streams() -> None:
    from litellm.responses import streaming_iterator as it

    watch_stream_class(it.SyncResponsesAPIStreamingIterator, it.ResponsesAPIStreamingIterator)
    # litellm fakes a stream (one plain call, then events) where a provider cannot stream, and
    # answers some from its cache: those iterators go both ways
    for cls in (getattr(it, "MockResponsesAPIStreamingIterator", None),
                getattr(it, "CachedResponsesAPIStreamingIterator", None)):
        if cls is not None:
            watch_stream_class(cls, cls)


RESPONSES = Kind(provider=PROVIDER, functions=("responses", "aresponses"), positional=("input", "model"),
                 request=responses_request, from_response=partial(from_response, PROVIDER),
                 accumulator=partial(ResponsesStreamAccumulator, PROVIDER), replay=_replay,
                 patch_streams=_patch_streams)
