"""Capture of ``litellm``'s ``completion`` and ``acompletion``, plain and streamed, through
the machinery of ``litellm_patch.py``: what is particular to chat completions is here (the
request and answer are read as the openai client's, ``record.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..trajectory.records import LLMCall
from .litellm_patch import Kind, ReplayStream, watch_stream_class
from .record import StreamAccumulator, chunks_from_call, from_response, request_parts, response_from_call


def _completion_replay(kwargs: dict[str, Any], call: LLMCall) -> Any:
    import litellm

    if kwargs.get("stream") is True:
        return ReplayStream([litellm.ModelResponseStream(**c) for c in chunks_from_call(call)])
    return litellm.ModelResponse(**response_from_call(call))


def _patch_completion_streams() -> None:
    from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

    watch_stream_class(CustomStreamWrapper, CustomStreamWrapper)


COMPLETION = Kind(provider="litellm", functions=("completion", "acompletion"), positional=("model", "messages"),
                  request=request_parts, from_response=partial(from_response, "litellm"),
                  accumulator=partial(StreamAccumulator, "litellm"), replay=_completion_replay,
                  patch_streams=_patch_completion_streams)
