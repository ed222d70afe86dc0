"""Conversations -- chat messages with their tools, as a JSONL file of them holds -- as
trajectories, for supervised training (``run.train_sft``): each assistant message becomes an
answered call whose request is everything before it, so the assistant's answers (tool calls
included) are what is learned and the rest is context.

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "tool_calls": [...]}, ...],
     "tools": [{"type": "function", "function": {...}}]}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Union

from ..errors import TrajectoryError
from .records import Choice, Group, LLMCall, Trajectory, check_messages

Examples = Union[str, Path, Iterable[Union[Trajectory, Group, dict[str, Any]]]]


def conversation_trajectory(conversation: dict[str, Any], where: str = "conversation") -> Trajectory:
    """One conversation as a trajectory (TrajectoryError naming ``where`` if it is not one)."""
    if not isinstance(conversation, dict) or "messages" not in conversation:
        raise TrajectoryError(f"{where} must be an object with \"messages\" (and optionally \"tools\"), "
                              f"got {str(conversation)[:80]!r}")
    messages = check_messages(conversation["messages"], where=f"{where}.messages")
    tools = conversation.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise TrajectoryError(f"{where}.tools must be a list of tools, got {type(tools).__name__}")
    calls = [LLMCall(index=n, model="", messages=messages[:i], tools=tools,
                     choices=[Choice(message=m, finish_reason="tool_calls" if m.get("tool_calls") else "stop")])
             for n, (i, m) in enumerate((i, m) for i, m in enumerate(messages) if m["role"] == "assistant")]
    if not calls:
        raise TrajectoryError(f"{where} has no assistant message: there is nothing in it to learn")
    return Trajectory(rollout="conversation", calls=calls, metadata={"source": where})


def as_trajectories(data: Examples) -> list[Trajectory]:
    """Trajectories from what ``train_sft`` accepts: trajectories, groups (their members),
    conversation dicts, or the path of a JSONL file of conversations."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        if not path.is_file():
            raise TrajectoryError(f"{path} is not a file of conversations (JSON Lines, one per line)")
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise TrajectoryError(f"{path}, line {n}: not JSON ({e})") from None
                out.append(conversation_trajectory(obj, f"{path.name}, line {n}"))
        return out
    out = []
    for i, item in enumerate(data):
        if isinstance(item, Trajectory):
            out.append(item)
        elif isinstance(item, Group):
            out.extend(item.trajectories)
        else:
            out.append(conversation_trajectory(item, f"examples[{i}]"))
    return out
