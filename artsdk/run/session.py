"""``art.session``: open a training session on a model with the configured backend, and the
``Session`` it yields -- ``train`` (GRPO), ``train_sft`` (a supervised warm-up), ``evaluate``
and ``loop``.

```python
model = art.TrainableModel("agent", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
async with art.session(model) as run:
    groups = await art.gather(play, games, group_size=8, rewards=[won])
    result = await run.train(groups)
```
"""

from __future__ import annotations

import logging
import secrets
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Sequence, Union

import anyio

from ..backend import Backend, Endpoint, TrainableModel, TrainResult, load_backend, opened
from ..capture.context import Route, routes
from ..config import settings
from ..errors import RolloutError, first_error
from ..store import default_store
from ..trackers import open_trackers
from ..trajectory.conversations import Examples, as_trajectories
from ..trajectory.records import Group
from .evaluate import evaluate
from .loop import loop
from .progress import Progress

log = logging.getLogger("artsdk")


class Session:
    """An open training session: calls naming the model are served by the backend, and
    ``train`` runs GRPO steps. Get one from ``art.session(model)``.

    ``run_id`` names the training run: what the session gathers and trains is filed under it
    (trajectories, steps, checkpoints), so two runs of one model never mix. ``resumed`` says
    whether it continued from an earlier run's last checkpoint; ``meta`` is what the run
    remembered (``remember``)."""

    def __init__(self, model: TrainableModel, backend: Backend, endpoint: Endpoint, step: int,
                 trackers: Sequence[Any] = (), run_id: str = "", resumed: bool = False,
                 meta: Optional[dict[str, Any]] = None) -> None:
        self.model = model
        self.backend = backend
        self.endpoint = endpoint
        self.step = step
        self.run_id = run_id
        self.resumed = resumed
        self.meta = dict(meta or {})
        self.history: list[TrainResult] = []
        self.trackers = list(trackers)  # where each step's metrics also go (see artsdk.trackers)
        self._gathers: dict[int, int] = {}  # step -> gathers made at it (each samples with seeds of its own)

    async def evaluate(self, agent: Any, scenarios: Any, **options: Any) -> Any:
        """How the model at the current step does on held-out scenarios: a gather that trains
        nothing, stored as an evaluation and filed with the step (``artsdk/run/evaluate.py``)::

            result = await run.evaluate(play, held_out, rewards=[won], temperature=0.0)
            print(result.reward, "±", result.reward_se, result.parts)
        """
        return await evaluate(self, agent, scenarios, **options)

    def loop(self, agent: Any, scenarios: Any, **options: Any) -> AsyncIterator[TrainResult]:
        """Gather and train at once: rollouts go on while earlier steps train, no trained token
        more than ``max_policy_lag`` steps old (``artsdk/run/loop.py``); yields each step's result::

            async for result in run.loop(play, games, group_size=8, rewards=[won], steps=20,
                                         scenarios_per_step=8, max_policy_lag=1):
                ...
        """
        return loop(self, agent, scenarios, **options)

    def next_gather(self) -> int:
        """Count a gather at the current step; its number among them (sampling seeds differ)."""
        n = self._gathers.get(self.step, 0)
        self._gathers[self.step] = n + 1
        return n

    async def remember(self, **meta: Any) -> None:
        """Keep facts about this run in the store (``run.meta`` when it is resumed), e.g. the
        evaluation it started from."""
        self.meta.update(meta)
        await anyio.to_thread.run_sync(lambda: default_store().record_run(
            self.model.project, self.model.name, self.run_id, self.model.base_model, meta))

    async def train(self, groups: Sequence[Group], *, extra_metrics: Optional[dict[str, float]] = None,
                    **config: Any) -> TrainResult:
        """One training step on ``groups``. Groups with no signal (all rewards equal) carry
        nothing to learn from: the result counts them. When no group has anything to learn
        from, nothing moves: ``result.trained`` is False and ``result.reason`` says why.
        ``extra_metrics`` are recorded with the step's own (``run.loop`` adds its ``loop/``
        figures so)."""
        groups = list(groups)
        if not groups:
            raise RolloutError("train() got no groups; gather some first with art.gather")
        bad = [g for g in groups if not isinstance(g, Group)]
        if bad:
            raise RolloutError(f"train() takes art.Group objects, got {type(bad[0]).__name__}")
        try:
            result = await self._showing_progress(f"step {self.step + 1} of {self.model.name}",
                                                  self.backend.train(self.model, groups, **config))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # a step the backend committed as it was stopped is recorded too
                await self._catch_up()
            raise
        result.metrics.update(extra_metrics or {})
        self.history.append(result)
        if not result.trained:
            log.warning("%s: nothing was trained, the model stays at step %d: %s", self.model.name,
                        result.step, result.reason)
            with anyio.CancelScope(shield=True):  # filed with the step it stayed at: the viewer lists it
                untrained = sum(1 for r in self.history if not r.trained and r.step == result.step)
                await anyio.to_thread.run_sync(lambda: default_store().add_step_metrics(
                    self.model.project, self.model.name, result.step,
                    {"untrained_batches": float(untrained), "untrained_reason": result.reason}, self.run_id))
            return result
        self.step = result.step
        with anyio.CancelScope(shield=True):  # once the backend has the step, the store gets it too
            await anyio.to_thread.run_sync(lambda: default_store().record_step(  # a commit: off the event loop
                self.model.project, self.model.name, result.step, result.metrics, result.checkpoint, self.run_id))
        for tracker in self.trackers:
            await anyio.to_thread.run_sync(tracker.log, self.model, result.step, result.metrics)
        return result

    async def train_sft(self, data: Examples, **config: Any) -> TrainResult:
        """A supervised warm-up: train on good conversations' assistant answers -- stored
        trajectories (the best-scored of a store, a stronger model's runs through the same
        agent code), groups, conversation dicts, or a JSONL file of them (``{"messages": [...],
        "tools": [...]}``). Numbered, checkpointed and served like a GRPO step: the next calls
        are answered by the result. Settings: ``learning_rate`` (2e-4), ``epochs`` (5),
        ``batch_size`` (2 examples per optimizer step), ``max_grad_norm``, ``weight_decay``."""
        examples = as_trajectories(data)
        if not examples:
            raise RolloutError("train_sft() got no examples: give trajectories, groups, conversations or a JSONL file")
        try:
            result = await self._showing_progress(f"step {self.step + 1} of {self.model.name} (supervised)",
                                                  self.backend.train_sft(self.model, examples, **config))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._catch_up()
            raise
        result.metrics["sft"] = 1.0  # a supervised step: the viewer marks it and draws its loss apart
        self.history.append(result)
        self.step = result.step
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: default_store().record_step(
                self.model.project, self.model.name, result.step, result.metrics, result.checkpoint, self.run_id))
        for tracker in self.trackers:
            await anyio.to_thread.run_sync(tracker.log, self.model, result.step, result.metrics)
        return result

    async def _showing_progress(self, label: str, work: Any) -> Any:
        """Await ``work`` (a training step) with its progress shown: the rows done, their rate and
        the time left where the backend says (``Backend.progress``), else the time it takes."""
        poll = getattr(self.backend, "progress", None)
        bar = Progress(label, unit="row")

        async def watch() -> None:
            while True:
                await anyio.sleep(0.5)
                rows = poll(self.model) if poll is not None else None
                bar.set(rows[0], total=rows[1]) if rows else bar.set(bar.n)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                try:
                    return await work
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as eg:  # the step's own error, not the group's wrapping of it
            raise first_error(eg) from None
        finally:
            bar.close()

    async def _catch_up(self) -> None:
        """Record a step the backend has but the store does not (one cut short by Ctrl-C
        after its checkpoint was written), so the store and the checkpoints agree."""
        try:
            step = await self.backend.step(self.model)
        except Exception:  # noqa: BLE001 - the backend is gone: nothing more to learn from it
            return
        if step > self.step:
            self.step = step
            await anyio.to_thread.run_sync(lambda: default_store().record_step(
                self.model.project, self.model.name, step, {}, None, self.run_id))


def _new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@asynccontextmanager
async def session(model: TrainableModel, backend: Optional[Backend] = None, *, resume: Union[bool, int] = True,
                  run: Optional[str] = None, **backend_options: Any) -> AsyncIterator[Session]:
    """Open a training session on ``model`` with the configured backend (or ``backend``).

    Inside it, any openai / litellm call with ``model=model.name`` is sent to the
    backend's endpoint, whatever base URL the client was built with.

    ``resume`` (the default) continues from the model's last checkpoint, in the run that
    wrote it; ``resume=False`` starts a new run from the base model, the backend moving the
    earlier checkpoints aside (never deleting them); ``resume=4`` continues from step 4's
    checkpoint, moving the steps after it aside (what a CheckpointError offers when the
    newest checkpoint cannot be read). ``run`` names a new run (default: the time it
    started, e.g. ``20261201-170502-3fa9``).
    """
    owns = backend is None
    be = backend if backend is not None else load_backend(**backend_options)
    trackers: list[Any] = []
    try:
        # a backend written before fresh registration existed takes no keyword it does not need
        if isinstance(resume, bool):
            endpoint = await (be.register(model) if resume else be.register(model, fresh=True))
        elif isinstance(resume, int) and resume >= 0:
            endpoint = await be.register(model, resume_step=resume)
        else:
            raise RolloutError(f"session(resume={resume!r}): give True (the newest checkpoint), False (the base "
                               f"model) or a step number")
        step = await be.step(model)
        store = default_store()
        await anyio.to_thread.run_sync(store.record_model, model.project, model.name, model.base_model, model.config)
        earlier = await anyio.to_thread.run_sync(store.latest_run, model.project, model.name) if step else None
        run_id = earlier if earlier is not None else (run or _new_run_id())
        meta = next((r["meta"] for r in await anyio.to_thread.run_sync(
            lambda: store.runs(project=model.project, model=model.name)) if r["run"] == run_id), {})
        if earlier is None:
            await anyio.to_thread.run_sync(lambda: store.record_run(
                model.project, model.name, run_id, model.base_model, {"resumed_from_step": step} if step else {}))
        cfg = settings()
        trackers = await anyio.to_thread.run_sync(open_trackers, cfg.trackers, cfg.tracker_options, model, cfg.home)
        run = Session(model, be, endpoint, step, trackers, run_id=run_id, resumed=bool(step), meta=meta)
        previous = routes.get(model.name)
        routes[model.name] = Route(endpoint.base_url, endpoint.api_key, endpoint.model)
        try:
            with opened(run):
                yield run
        finally:
            if previous is None:
                routes.pop(model.name, None)
            else:
                routes[model.name] = previous
    finally:
        for tracker in trackers:
            tracker.close()
        if owns:
            await be.close()
