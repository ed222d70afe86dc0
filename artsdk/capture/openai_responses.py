"""Capture for the openai client's Responses API: ``responses.create`` and ``.parse`` on
``OpenAI`` and ``AsyncOpenAI`` (``.stream()`` goes through ``create``), streamed or not,
through the raw-response wrappers too -- the default model API of openai-agents and
pydantic-ai. The machinery is the chat patch's (``openai.py``); what is particular to the
Responses API is here and in ``responses_record.py``.
"""

from __future__ import annotations

from typing import Any

from ..trajectory import LLMCall
from .openai import API, replay_stream
from .responses_record import ResponsesStreamAccumulator, events_from_call, from_response, response_from_call
from .responses_record import responses_request

PROVIDER = "openai-responses"


def _classes() -> tuple[type, type]:
    from openai.resources.responses import AsyncResponses, Responses

    return Responses, AsyncResponses


def _body(data: Any) -> Any:
    from openai._models import construct_type  # leniently, as the client itself builds responses
    from openai.types.responses import Response

    return construct_type(type_=Response, value=data)


def _event(data: Any) -> Any:
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    return construct_type(type_=ResponseStreamEvent, value=data)


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
                request=responses_request, from_response=lambda kw, resp, t: from_response(PROVIDER, kw, resp, t),
                accumulator=lambda kw: ResponsesStreamAccumulator(PROVIDER, kw), parse_body=_body,
                parse_event=_event, replay=_replay)
