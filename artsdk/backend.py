"""The one protocol every training backend implements, and ``art.session`` which drives it.

A backend serves a model behind an OpenAI-compatible endpoint and trains it on groups of
trajectories. Backends are found by name through the ``artsdk.backends`` entry-point group,
so ``backend = "remote"`` in the config swaps one for another without a code change:

```toml
[project.entry-points."artsdk.backends"]
mine = "my_package.backend:MyBackend"
```

```python
model = art.TrainableModel("agent", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
async with art.session(model) as run:
    groups = await art.gather(play, games, group_size=8, rewards=[won])
    result = await run.train(groups)
```
"""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager
from importlib.metadata import entry_points
from typing import Any, AsyncIterator, Optional, Protocol, Sequence, Union, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .capture.context import Route, routes
from .conversations import Examples
from .errors import BackendError, RolloutError, first_error
from .trajectory import Group, Trajectory

log = logging.getLogger("artsdk")
ENTRY_POINT_GROUP = "artsdk.backends"


def _default_project() -> str:
    from .config import settings

    return settings().project


class TrainableModel(BaseModel):
    """A model to train: a name agent code uses in ``model=``, the base model it starts from
    (a Hugging Face id, a local folder or a GGUF file) and backend settings such as LoRA rank.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    base_model: str
    project: str = Field(default_factory=_default_project)
    config: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, name: str, base_model: str, **data: Any) -> None:
        super().__init__(name=name, base_model=base_model, **data)


class Endpoint(BaseModel):
    """Where a backend serves a model: an OpenAI-compatible base URL, its key, and the
    model name to send (``name`` resolves to the newest step). ``moved_aside``: registered
    fresh, the folder the backend moved the model's earlier checkpoints to (never deleted)."""

    base_url: str
    api_key: str = "artsdk"
    model: str
    moved_aside: Optional[str] = None


class TrainResult(BaseModel):
    """What one training step did. ``trained`` is False when the groups held nothing to
    learn from: then no weight moved, ``step`` is unchanged, no checkpoint was written, and
    ``reason`` says why."""

    model_config = ConfigDict(extra="allow")

    step: int
    metrics: dict[str, float] = Field(default_factory=dict)
    checkpoint: Optional[str] = None
    trained: bool = True
    reason: Optional[str] = None
    groups_trained: int = 0
    groups_skipped: int = 0

    @field_validator("metrics", mode="before")
    @classmethod
    def _null_is_nan(cls, v: Any) -> Any:
        # strict JSON (artsdk serve's events) carries a figure that is not finite as null
        return {k: math.nan if x is None else x for k, x in v.items()} if isinstance(v, dict) else v


def nothing_to_train(groups: Sequence[Group], metrics: dict[str, float]) -> str:
    """Why a batch of groups moved no weight, in the user's words."""
    trajs = [t for g in groups for t in g.trajectories]
    scored = [t for g in groups for t in g.scored]
    if not scored:
        failed = sum(1 for t in trajs if t.error is not None)
        return (f"none of the {len(trajs)} trajectories was scored ({failed} failed, the rest have no "
                f"reward): look at their errors with `artsdk trajectories list --errors`")
    if all(g.no_signal for g in groups):
        return (f"every group has equal rewards (or fewer than two scored trajectories): GRPO learns from "
                f"differences within a group; make the reward finer-grained or the groups larger")
    if metrics.get("calls_other_model"):
        return ("no trajectory with a training signal has a call answered by this model (its calls were "
                "answered by other models): call it with model=<the trainable model's name>")
    return ("no trajectory with a training signal has sampled tokens of this model: were its LLM calls "
            "captured? (see docs/capture.md)")


@runtime_checkable
class Backend(Protocol):
    """A training backend: serve a model, train it on groups, report its step."""

    async def register(self, model: TrainableModel, *, fresh: bool = False,
                       resume_step: Optional[int] = None) -> Endpoint:
        """Load the model -- from its newest checkpoint, or with ``fresh`` from the base model,
        its earlier checkpoints moved aside, or from the checkpoint of ``resume_step``, the
        steps after it moved aside -- and return where it is served. A checkpoint that cannot
        be read is a CheckpointError naming it and the newest step that can."""
        ...

    async def train(self, model: TrainableModel, groups: Sequence[Group], **config: Any) -> TrainResult:
        """Run one training step on these groups; the next calls are served by the result."""
        ...

    async def train_sft(self, model: TrainableModel, trajectories: Sequence[Trajectory], **config: Any) -> TrainResult:
        """One supervised step on these trajectories' answers (numbered, checkpointed and served
        like a training step)."""
        ...

    async def step(self, model: TrainableModel) -> int:
        """The model's newest step (0 before any training)."""
        ...

    async def close(self) -> None:
        """Release what the backend holds (servers, devices)."""
        ...


def available_backends() -> dict[str, str]:
    """Installed backends: name -> ``module:Class``."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_backend(name: Optional[str] = None, **options: Any) -> Backend:
    """Build the backend called ``name`` (default: the ``backend`` setting) with the
    ``backend_options`` setting overridden by ``options``."""
    from .config import settings

    cfg = settings()
    name = name or cfg.backend
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = ", ".join(sorted(available_backends())) or "none installed"
        raise BackendError(
            f"no backend named {name!r} (installed: {known}). Install the extra that provides "
            f"it (pip install 'artsdk[local]') or set `backend` in artsdk.toml / ARTSDK_BACKEND"
        )
    try:
        cls = found[0].load()
    except ImportError as e:
        raise BackendError(
            f"backend {name!r} cannot be imported ({e}); install its dependencies, e.g. "
            f"pip install 'artsdk[{name}]'"
        ) from e
    opts = {**cfg.backend_options, **options}
    if name == "remote":
        opts.setdefault("url", cfg.backend_url)
        opts.setdefault("api_key", cfg.api_key)
    return cls(**opts)


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
        nothing, stored as an evaluation and filed with the step (``artsdk/evaluate.py``)::

            result = await run.evaluate(play, held_out, rewards=[won], temperature=0.0)
            print(result.reward, "±", result.reward_se, result.parts)
        """
        from .evaluate import evaluate

        return await evaluate(self, agent, scenarios, **options)

    def loop(self, agent: Any, scenarios: Any, **options: Any) -> AsyncIterator[TrainResult]:
        """Gather and train at once: rollouts go on while earlier steps train, no trained token
        more than ``max_policy_lag`` steps old (``artsdk/loop.py``); yields each step's result::

            async for result in run.loop(play, games, group_size=8, rewards=[won], steps=20,
                                         scenarios_per_step=8, max_policy_lag=1):
                ...
        """
        from .loop import loop

        return loop(self, agent, scenarios, **options)

    def next_gather(self) -> int:
        """Count a gather at the current step; its number among them (sampling seeds differ)."""
        n = self._gathers.get(self.step, 0)
        self._gathers[self.step] = n + 1
        return n

    async def remember(self, **meta: Any) -> None:
        """Keep facts about this run in the store (``run.meta`` when it is resumed), e.g. the
        evaluation it started from."""
        from .store import default_store

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
        from .store import default_store

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
        from .conversations import as_trajectories
        from .store import default_store

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
        from .progress import Progress

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
        from .store import default_store

        try:
            step = await self.backend.step(self.model)
        except Exception:  # noqa: BLE001 - the backend is gone: nothing more to learn from it
            return
        if step > self.step:
            self.step = step
            await anyio.to_thread.run_sync(lambda: default_store().record_step(
                self.model.project, self.model.name, step, {}, None, self.run_id))


_sessions: list[Session] = []


def _new_run_id() -> str:
    import secrets
    import time

    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def current_session() -> Optional[Session]:
    """The innermost open session, or None."""
    return _sessions[-1] if _sessions else None


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
    from .config import settings
    from .store import default_store
    from .trackers import open_trackers

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
        _sessions.append(run)
        try:
            yield run
        finally:
            _sessions.remove(run)
            if previous is None:
                routes.pop(model.name, None)
            else:
                routes[model.name] = previous
    finally:
        for tracker in trackers:
            tracker.close()
        if owns:
            await be.close()
