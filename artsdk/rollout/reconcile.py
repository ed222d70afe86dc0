"""The two records of a rollout's calls to the trainable model, made one: the client's (the
patched clients, in the rollout's context) and the endpoint's (every call the backend's
server answered for the rollout, whatever sent it: a child process, ``curl``, a native
client, a thread the rollout's context did not reach but that used ``art.rollout_env()``).

A call both saw is matched by the number the patch sent with it (``X-Artsdk-Call``); the
client's record is kept, and filled with the endpoint's token ids where the client got none.
A call only the endpoint saw is added to the trajectory from its record (``provider``
``"endpoint"``), with the exact prompt and sampled token ids. A call to the trainable model
only the client saw, or one the endpoint saw with the patch's number but the client lost, is
a mismatch: a warning on the trajectory, and under ``strict_capture`` the rollout fails.
The counts go in ``trajectory.metadata["calls_recorded"]``.

Also here: ``rollout_env()`` and ``rollout_url()``, the per-rollout address a process or a
client artsdk does not patch sends its calls to, and ``bind()``, which carries a rollout's
context into a thread or a pool the rollout did not start.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable, TypeVar

from ..backend import current_session
from ..capture.context import current_recorder, routes
from ..errors import CaptureError, RolloutError
from ..trajectory.records import ErrorInfo, LLMCall, Trajectory

T = TypeVar("T")
MISMATCH = "the client's and the endpoint's records of this rollout's calls to the trainable model differ"


def served_names() -> set[str]:
    """The names trainable models are served under in the open sessions."""
    return {r.served_model or name for name, r in routes.items()}


def reconcile(traj: Trajectory, served: list[LLMCall], strict: bool) -> None:
    """Make ``traj.calls`` hold every call the endpoint answered for it (``served``, in the
    order they arrived), and say in its metadata what each record held."""
    names = served_names()
    policy = [c for c in traj.calls if (c.served_by or "").partition("@")[0] in names and not c.error]
    by_number = {c.index: c for c in traj.calls}
    matched, added, lost = 0, [], []
    for call in served:
        number = getattr(call, "call", None)
        mine = by_number.get(number) if number is not None else None
        if mine is not None and (mine.served_by or "").partition("@")[0] == (call.served_by or "").partition("@")[0]:
            matched += 1
            _fill_tokens(mine, call)
            continue
        if mine is not None and mine.error and mine.served_by is None and not mine.choices:
            # the client raised after the answer came (a parse, length or validation error, a
            # cancellation): one call, the endpoint's answer in the client's record of it
            matched += 1
            _take_answer(mine, call)
            continue
        if number is not None:  # the patch numbered it, yet the client has no such call: lost on the client
            lost.append(number)
        added.append(call)
    seen = {getattr(c, "call", None) for c in served}
    unseen = [c.index for c in policy if c.index not in seen]
    for call in added:  # without the endpoint's bookkeeping (its number, how the rollout was named)
        clean = LLMCall.model_validate(call.model_dump(exclude={"call", "via", "at"}))
        clean.index = len(traj.calls)
        traj.calls.append(clean)
    traj.metadata["calls_recorded"] = {"client": len(policy), "endpoint": len(served), "matched": matched,
                                       "endpoint_only": len(added), "client_only": len(unseen)}
    problems = []
    if unseen:
        problems.append(f"call(s) {unseen} reached the trainable model by the client's record but not by the "
                        f"endpoint's")
    if lost:
        problems.append(f"the endpoint answered call(s) numbered {lost} that the client did not record (added "
                        f"from the endpoint's record)")
    if problems:
        text = f"{MISMATCH}: {'; '.join(problems)}"
        traj.warnings.append(text)
        if strict and traj.error is None:
            traj.error = ErrorInfo(type=CaptureError.__name__, message=text + " (strict_capture)")


def _take_answer(mine: LLMCall, theirs: LLMCall) -> None:
    """The client's record of a call it raised on, with what the endpoint answered: the model
    and step that served it, the prompt's and answers' tokens. Its ``error`` stays: the agent
    got the exception, not the answer, so the call is shown but not trained."""
    mine.served_by, mine.step, mine.usage = theirs.served_by, theirs.step, theirs.usage
    mine.prompt_token_ids = theirs.prompt_token_ids
    mine.choices = [c.model_copy(deep=True) for c in theirs.choices]


def _fill_tokens(mine: LLMCall, theirs: LLMCall) -> None:
    """The client's record of a call, with the endpoint's prompt and sampled token ids where
    the client got none (a client that drops unknown fields)."""
    if mine.prompt_token_ids is None:
        mine.prompt_token_ids = theirs.prompt_token_ids
    for a, b in zip(mine.choices, theirs.choices):
        if a.token_ids is None and b.token_ids is not None:
            a.token_ids, a.logprobs = b.token_ids, b.logprobs


async def with_endpoint_record(traj: Trajectory) -> None:
    """Reconcile ``traj`` with the endpoint's record of it, when a session is open and its
    backend keeps one (``Backend.endpoint_calls``)."""
    from ..config import settings

    run = current_session()
    fetch = getattr(run.backend, "endpoint_calls", None) if run is not None else None
    if fetch is None:
        return
    try:
        served = await fetch(traj.id)
    except Exception as e:  # noqa: BLE001 - the trajectory stands on the client's record; say so
        traj.warnings.append(f"the endpoint's record of this rollout could not be read ({type(e).__name__}: {e}); "
                             f"the trajectory holds the client's record alone")
        return
    if served or any((c.served_by or "").partition("@")[0] in served_names() for c in traj.calls):
        reconcile(traj, list(served), settings().strict_capture)


def note_changed_history(traj: Trajectory) -> None:
    """Say on the trajectory where a call of a conversation does not carry the one before as it
    was sampled -- the agent changed its history -- so that the two train as separate segments.
    Calls that start another conversation (another first message) are not flagged."""
    calls = [c for c in traj.calls if c.prompt_token_ids and c.choices and c.choices[0].token_ids is not None]
    for a, b in zip(calls, calls[1:]):
        if not a.messages or not b.messages or b.messages[0] != a.messages[0]:
            continue
        carried = a.prompt_token_ids + list(a.choices[0].token_ids)  # type: ignore[operator]
        if b.prompt_token_ids[:len(carried)] != carried:  # type: ignore[index]
            traj.warnings.append(f"call {b.index} continues the conversation of call {a.index}, but with its history "
                                 f"changed (its prompt does not carry call {a.index}'s prompt and sampled tokens): the "
                                 f"two train as separate segments")


def rollout_url() -> str:
    """The base URL that files a call under the running rollout: the open session's endpoint
    at ``/r/<rollout id>/v1``. For a client artsdk does not patch (``httpx.post``, a native
    client); inside a rollout only."""

    rec = current_recorder.get()
    run = current_session()
    if rec is None or rec.rollout_id is None:
        raise RolloutError("rollout_url() / rollout_env() is for code inside a rollout (an @art.rollout function)")
    if run is None or not run.endpoint.base_url:
        raise RolloutError("rollout_url() / rollout_env() need an open art.session: its backend's endpoint is "
                           "where the calls go")
    root = run.endpoint.base_url.rstrip("/").removesuffix("/v1")
    return f"{root}/r/{rec.rollout_id}/v1"


def rollout_env() -> dict[str, str]:
    """What a child process needs for its calls to the trainable model to land on the running
    rollout's trajectory: ``OPENAI_BASE_URL`` (the rollout's URL), ``OPENAI_API_KEY`` (the
    backend's key) and ``ARTSDK_ROLLOUT`` (its id)::

        subprocess.run(["python", "tool.py"], env={**os.environ, **art.rollout_env()})

    The calls are filed by the endpoint and added to the trajectory when the rollout ends,
    with their exact token ids. Inside a rollout, with a session open."""

    url = rollout_url()
    run = current_session()
    rec = current_recorder.get()
    return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": run.endpoint.api_key,  # type: ignore[union-attr]
            "ARTSDK_ROLLOUT": rec.rollout_id}  # type: ignore[union-attr,dict-item]


def bind(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, run in the current rollout's context wherever it is called: for work handed to
    a thread or a pool that the rollout did not start (a long-lived worker fed by a queue, a
    pool made before the rollout), so the calls it makes are recorded in this rollout::

        jobs.put(art.bind(lambda: client.chat.completions.create(model="agent", ...)))
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def bound(*args: Any, **kwargs: Any) -> T:
        return ctx.copy().run(fn, *args, **kwargs)  # a copy each time: bound work may run twice at once

    return bound
