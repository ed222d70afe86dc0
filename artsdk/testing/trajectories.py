"""Helpers for testing rewards offline, with no model and no server.

```python
from artsdk.testing import trajectory

def test_won():
    t = trajectory(messages=[{"role": "user", "content": "play"},
                             {"role": "assistant", "content": "B2"}],
                   outcome={"winner": "x"})
    assert won(t) == 1.0
```

The pytest fixture ``art_store`` (registered when artsdk is installed, see
``artsdk.testing.pytest_plugin``) gives each test an empty SQLite store in a temporary folder and
makes it the default store.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..trajectory.records import Choice, ErrorInfo, LLMCall, Message, Trajectory, check_messages


def trajectory(
    messages: Sequence[Message] = (),
    *,
    outcome: Any = None,
    calls: Optional[Sequence[Sequence[Message]]] = None,
    rewards: Optional[dict[str, float]] = None,
    error: Optional[str] = None,
    token_ids: Optional[Sequence[int]] = None,
    logprobs: Optional[Sequence[float]] = None,
    **fields: Any,
) -> Trajectory:
    """Build a Trajectory by hand.

    ``messages`` is one conversation; every assistant message in it becomes the answer of
    an LLM call whose request is everything before it. ``calls`` gives several separate
    conversations instead. ``token_ids``/``logprobs`` attach to the last answer. ``error``
    marks the rollout as failed with that message.
    """
    convos = list(calls) if calls is not None else [messages]
    built: list[LLMCall] = []
    for n, convo in enumerate(convos):
        convo = check_messages(convo, where=f"calls[{n}]" if calls is not None else "messages")
        for i, m in enumerate(convo):
            if m["role"] == "assistant":
                built.append(LLMCall(index=len(built), model=fields.get("model") or "test",
                                     messages=convo[:i],
                                     choices=[Choice(message=m, finish_reason="stop")]))
    if (token_ids is not None or logprobs is not None) and built:
        last = built[-1].choices[0]
        last.token_ids = list(token_ids) if token_ids is not None else None
        last.logprobs = list(logprobs) if logprobs is not None else None
    t = Trajectory(outcome=outcome, calls=built, rewards=dict(rewards or {}), **fields)
    if rewards:
        t.reward = sum(rewards.values())
    if error is not None:
        t.error = ErrorInfo(type="Exception", message=error)
    return t
