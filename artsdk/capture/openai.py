"""Capture of the ``openai`` client's chat completions (``create``, ``parse``, and
``.stream()``, which goes through ``create``), through the machinery of ``openai_patch.py``:
what is particular to chat completions is here and in ``record.py``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..trajectory.records import LLMCall
from .openai_patch import API, built_as, replay_stream
from .record import StreamAccumulator, chunks_from_call, from_response, request_parts, response_from_call


def _chat_classes() -> tuple[type, type]:
    from openai.resources.chat.completions import AsyncCompletions, Completions

    return Completions, AsyncCompletions


def _chat_replay(resource: Any, kwargs: dict[str, Any], kind: str, call: LLMCall) -> Any:
    """Answer from the recording with the same object types the network would give."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    if kwargs.get("stream") is True:
        return replay_stream(resource, ChatCompletionChunk, list(chunks_from_call(call)), "chat/completions")
    completion = ChatCompletion.model_validate(response_from_call(call))
    if kind == "parse":
        from openai import omit
        from openai.lib._parsing._completions import parse_chat_completion

        return parse_chat_completion(response_format=kwargs.get("response_format", omit),
                                     input_tools=kwargs.get("tools", omit), chat_completion=completion)
    return completion


CHAT = API(provider="openai", path="chat.completions", classes=_chat_classes, methods=("create", "parse"),
           request=request_parts, from_response=partial(from_response, "openai"),
           accumulator=partial(StreamAccumulator, "openai"),
           parse_body=built_as("openai.types.chat:ChatCompletion"),
           parse_event=built_as("openai.types.chat:ChatCompletionChunk"), replay=_chat_replay)
