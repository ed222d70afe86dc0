"""Capture for the openai client's Responses API: ``responses.create`` and ``.parse`` on
``OpenAI`` and ``AsyncOpenAI`` (``.stream()`` goes through ``create``), streamed or not,
through the raw-response wrappers too -- the default model API of openai-agents and
pydantic-ai. The machinery is ``openai_patch.py``; what is particular to the Responses API
is here and in ``responses_record.py``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..trajectory.records import LLMCall
from .openai_patch import API, built_as, replay_stream
from .responses_record import ResponsesStreamAccumulator, events_from_call, from_response, response_from_call
from .responses_record import responses_request

PROVIDER = "openai-responses"


def _classes() -> tuple[type, type]:
    from openai.resources.responses import AsyncResponses, Responses

    return Responses, AsyncResponses


def _replay(resource: Any, kwargs: dict[str, Any], kind: str, call: LLMCall) -> Any:
    """The recorded answer as the client would have returned it: a Response, a stream of
    events, or a ParsedResponse."""
    from openai.types.responses import Response, ResponseStreamEvent

    if kwargs.get("stream") is True:
        return replay_stream(resource, ResponseStreamEvent, list(events_from_call(call)), "responses")
    response = Response.model_validate(response_from_call(call))
    if kind == "parse":
        from openai import omit
        from openai.lib._parsing._responses import parse_response

        return parse_response(text_format=kwargs.get("text_format", omit), input_tools=kwargs.get("tools", omit),
                              response=response)
    return response


RESPONSES = API(provider=PROVIDER, path="responses", classes=_classes, methods=("create", "parse"),
                request=responses_request, from_response=partial(from_response, PROVIDER),
                accumulator=partial(ResponsesStreamAccumulator, PROVIDER),
                parse_body=built_as("openai.types.responses:Response"),
                parse_event=built_as("openai.types.responses:ResponseStreamEvent"), replay=_replay)
