"""``@art.rollout``: turn existing agent code into something that produces trajectories.

```python
@art.rollout
async def play(game: Game) -> dict:
    resp = await client.chat.completions.create(model="agent", messages=...)
    return {"winner": ...}

await play(game)                    # still returns {"winner": ...}
traj = await play.collect(game)     # an art.Trajectory: calls, outcome, rewards; stored
```
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import logging
from contextlib import nullcontext
from datetime import datetime, timezone
from time import perf_counter, time
from typing import Any, Awaitable, Callable, Generic, Optional, Sequence, TypeVar, Union, overload

import anyio

from ..backend import current_session
from ..capture import Recorder, current, current_recorder
from ..config import settings
from ..errors import CaptureError, RewardError
from ..rewards.functions import RewardLike, score
from ..trajectory.records import ErrorInfo, Trajectory, assigned, constructed
from .reconcile import note_changed_history, with_endpoint_record

log = logging.getLogger("artsdk")
R = TypeVar("R")

NO_CALLS = (
    "no LLM call was captured in this rollout, so there is nothing in it to train on. Captured: the openai "
    "client (chat.completions, responses; sync, async, streamed, raw), litellm (completion, acompletion, "
    "responses, aresponses) and the frameworks built on them (openai-agents, pydantic-ai, LangChain, "
    "smolagents, DSPy). Make the model calls inside the decorated function, with one of these"
)


class Args:
    """Several arguments for one scenario: ``art.Args(board, level=2)`` calls
    ``play(board, level=2)``. A scenario that is not an Args is passed as the one argument."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"Args({', '.join(parts)})"


def _context_fields() -> dict[str, Any]:
    run = current_session()
    if run is not None:
        return {"project": run.model.project, "model": run.model.name, "run": run.run_id, "step": run.step}
    return {"project": settings().project}


def _inside_kept_rollout() -> bool:
    """Whether the rollout running here (if any) will store its trajectory."""
    outer = current_recorder.get()
    return outer is not None and outer.kept and outer.pid == current.pid


def _positional(signature: inspect.Signature) -> tuple[list[str], int]:
    """(the leading positional-or-keyword parameters, how many of them a call must give): a
    call with between those many positional arguments and all of them, and nothing else, binds
    them one to one -- its scenario is a zip, without inspect's bind. A function with another
    parameter that must be given gets (no names, 1): never that way."""
    params = list(signature.parameters.values())
    names = [p.name for p in itertools.takewhile(lambda p: p.kind is p.POSITIONAL_OR_KEYWORD, params)]
    rest = params[len(names):]
    if any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.KEYWORD_ONLY) for p in rest):
        return [], 1
    return names, sum(1 for p in params[:len(names)] if p.default is p.empty)


class Rollout(Generic[R]):
    """A decorated agent function. Calling it behaves exactly like the function; ``collect``
    and ``art.gather`` run it and return trajectories."""

    def __init__(self, fn: Callable[..., Any], *, name: Optional[str] = None,
                 rewards: Sequence[RewardLike] = ()) -> None:
        if not callable(fn):
            raise TypeError(f"@art.rollout needs a function, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "rollout"))
        self.rewards = list(rewards)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        self._positional = _positional(self.signature)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<rollout {self.name!r}>"

    # -- plain calls ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._call_async(args, kwargs)
        in_kept = _inside_kept_rollout()
        recording = _Recording(self, args, kwargs, plain=True)
        try:
            with recording as traj:
                outcome = self.fn(*args, **kwargs)
                assigned(traj, outcome=outcome)
        finally:
            self._record_plain(recording, in_kept)
        return outcome

    async def _call_async(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        in_kept = _inside_kept_rollout()
        recording = _Recording(self, args, kwargs, plain=True)
        try:
            with recording as traj:
                outcome = await self.fn(*args, **kwargs)
                assigned(traj, outcome=outcome)
        finally:
            if recording.traj is not None:
                if current_session() is not None:  # only a session's backend keeps an endpoint record
                    with anyio.CancelScope(shield=True):  # its calls the endpoint saw are its own, not the outer's
                        await with_endpoint_record(recording.traj)
            self._record_plain(recording, in_kept)
        return outcome

    @staticmethod
    def _record_plain(recording: "_Recording", inside_kept: bool) -> None:
        # plain calls are stored only when asked to (or inside a session): a decorated
        # function called from a unit test should not write files -- unless it ran inside a
        # rollout whose trajectory is kept and names it (its calls are on this one alone)
        if recording.traj is not None and (inside_kept or recording.kept):
            from ..store import default_store

            default_store().submit(recording.traj)

    # -- trajectories -----------------------------------------------------------------

    def _new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trajectory:
        names, required = self._positional
        if not kwargs and required <= len(args) <= len(names):  # the usual call: what bind would give
            scenario = dict(zip(names, args))
        else:
            try:
                scenario = dict(self.signature.bind(*args, **kwargs).arguments)
            except TypeError as e:
                raise TypeError(f"rollout {self.name!r}: {e}") from None
        # unvalidated: every field here is one artsdk made (a plain call of a rollout costs less);
        # its start is set when it ends (``_finish``), from the clock read as it starts
        return constructed(Trajectory, rollout=self.name, scenario=scenario, started_at=None, **_context_fields())

    async def run(self, args: tuple[Any, ...] = (), kwargs: Optional[dict[str, Any]] = None, *,
                  timeout: Optional[float] = None, limiter: Optional[anyio.CapacityLimiter] = None,
                  interrupted: Optional[Callable[[Trajectory], None]] = None, seed: Optional[int] = None,
                  **fields: Any) -> Trajectory:
        """Run once and return the trajectory, unscored and unstored. Exceptions from the
        agent code (and a timeout) are recorded in ``trajectory.error``, not raised. If the run
        is cancelled, ``interrupted`` gets the trajectory so far (``error.type`` "Interrupted")
        before the cancellation goes on. ``seed``: the sampling seed of the trainable model's
        calls that set none (``art.gather`` gives one in a session)."""
        kwargs = kwargs or {}
        traj: Optional[Trajectory] = None
        try:
            with _Recording(self, args, kwargs, seed=seed, fields=fields) as traj:
                try:
                    with anyio.fail_after(timeout) if timeout else nullcontext():
                        if self.is_async:
                            traj.outcome = await self.fn(*args, **kwargs)
                        else:
                            ctx = contextvars.copy_context()
                            traj.outcome = await anyio.to_thread.run_sync(
                                functools.partial(ctx.run, self.fn, *args, **kwargs),
                                limiter=limiter, abandon_on_cancel=True,
                            )
                except Exception as e:
                    if isinstance(e, TimeoutError) and timeout:
                        e = TimeoutError(f"rollout {self.name!r} took longer than its timeout of {timeout} s")
                    traj.error = ErrorInfo.from_exception(e)
            await with_endpoint_record(traj)  # calls only the backend's endpoint saw (reconcile.py)
            note_changed_history(traj)
            return traj
        except BaseException:
            if interrupted is not None and traj is not None:
                interrupted(traj)
            raise

    async def collect(self, *args: Any, **kwargs: Any) -> Trajectory:
        """Run once, apply this rollout's rewards, store the trajectory and return it.

        A rollout whose agent code raises still returns (and stores) a trajectory with
        ``error`` set. A reward that raises or returns a non-number raises RewardError after
        the trajectory is stored.
        """
        from ..store import default_store

        traj = await self.run(args, kwargs, interrupted=default_store().submit)
        problem: Optional[RewardError] = None
        try:
            await score([traj], self.rewards)
        except RewardError as e:
            problem = e
            traj.warnings.append(str(e))
        await default_store().asave(traj)
        if problem is not None:
            raise problem
        return traj

    def collect_sync(self, *args: Any, **kwargs: Any) -> Trajectory:
        """``collect`` for code without an event loop."""
        return anyio.run(functools.partial(self.collect, *args, **kwargs))


class _Recording:
    """``with _Recording(rollout, args, kwargs) as traj:`` -- a trajectory that records the LLM
    calls made inside the block. An exception leaving the block is recorded as ``error`` and goes
    on. ``kept``: whether the trajectory will be stored (always when collected or gathered; a plain
    call's when recording is on or a session is open). (A class, not a generator: a plain call of
    a rollout runs it every time, and capture's cost is what it adds to a call.)"""

    __slots__ = ("rollout", "args", "kwargs", "seed", "fields", "kept", "traj", "rec", "t0", "wall0", "token")

    def __init__(self, rollout: Rollout[Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, plain: bool = False,
                 seed: Optional[int] = None, fields: Optional[dict[str, Any]] = None) -> None:
        self.rollout, self.args, self.kwargs, self.seed, self.fields = rollout, args, kwargs, seed, fields
        self.kept = not plain or bool(settings().record_calls) or current_session() is not None
        self.traj: Optional[Trajectory] = None

    def __enter__(self) -> Trajectory:
        traj = self.rollout._new(self.args, self.kwargs)
        if self.fields:
            for k, v in self.fields.items():
                setattr(traj, k, v)
        outer = current_recorder.get()  # a rollout called inside another one: the outer refers to it
        if outer is not None and outer.pid != current.pid:
            outer = None  # a forked child's copy of the context: no rollout of this process
        rec = self.rec = Recorder(self.seed, traj.id)
        rec.kept = self.kept
        if outer is not None:
            traj.metadata["parent"] = outer.rollout_id
            outer.children.append(traj.id)
        self.t0, self.wall0 = perf_counter(), time()
        self.token = current_recorder.set(rec)
        self.traj = traj  # set last: a call the block never ran (bad arguments) leaves no trajectory
        return traj

    def __exit__(self, kind: Any, e: Any, tb: Any) -> None:
        traj = self.traj
        try:
            if isinstance(e, Exception):
                traj.error = ErrorInfo.from_exception(e)
            elif e is not None and traj.error is None:  # Ctrl-C, a cancelled task: kept as what it is, then passed on
                traj.error = ErrorInfo(type="Interrupted", message=f"the rollout was stopped before it finished "
                                                                   f"({type(e).__name__})")
        finally:
            current_recorder.reset(self.token)
            _finish(traj, self.rec, self.wall0, perf_counter() - self.t0)


def _finish(traj: Trajectory, rec: Recorder, started: float, duration: float) -> None:
    calls = rec.close()
    ended = time()
    # set as artsdk made them, without pydantic's per-field assignment (this runs on every call
    # of a rollout); both times made here, one right after the other, costs less than apart
    assigned(traj, calls=calls, duration=duration, started_at=datetime.fromtimestamp(started, timezone.utc),
             ended_at=datetime.fromtimestamp(ended, timezone.utc))
    if rec.notes:
        traj.warnings.extend(rec.notes)
    if traj.step is None:
        for c in reversed(calls):
            if c.step is not None:
                assigned(traj, step=c.step)
                break
    if rec.children:  # each call is on one trajectory: the innermost rollout's, which this one names
        traj.metadata["children"] = list(rec.children)
    if not calls and not rec.children and traj.error is None:
        traj.warnings.append(NO_CALLS)
    if rec.refused is not None and traj.error is not None and traj.error.type != CaptureError.__name__:
        # a library below the agent turned the refusal into an error of its own (asyncio's
        # transports: a lost connection): the rollout failed because strict capture refused
        traj.error = ErrorInfo(type=CaptureError.__name__, traceback=traj.error.traceback,
                               message=f"{rec.refused} (the agent got {traj.error.type}: {traj.error.message})")
    if traj.error is None:
        for cut in calls:
            if cut.incomplete and cut.error:
                # the agent went on with an answer it did not know was cut short: not a result to train on
                traj.error = ErrorInfo(type="StreamCutError", message=f"call {cut.index}: {cut.error}")
                break


@overload
def rollout(fn: Callable[..., Awaitable[R]]) -> Rollout[R]: ...
@overload
def rollout(fn: Callable[..., R]) -> Rollout[R]: ...
@overload
def rollout(*, name: Optional[str] = None, rewards: Sequence[RewardLike] = ()) -> Callable[[Callable[..., Any]], Rollout[Any]]: ...


def rollout(fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
            rewards: Sequence[RewardLike] = ()) -> Union[Rollout[Any], Callable[[Callable[..., Any]], Rollout[Any]]]:
    """Decorate an agent function (sync or async). ``rewards`` are applied by ``collect``
    and by ``art.gather`` when it is given none."""
    if fn is not None:
        return Rollout(fn, name=name, rewards=rewards)
    return lambda f: Rollout(f, name=name, rewards=rewards)
