"""The one protocol every training backend implements, the small records it speaks in, and
which session is open -- what rollouts, capture and the backends may know of a run without
reaching up into the layer that runs it (``artsdk/run/``, where ``art.session`` lives).

A backend serves a model behind an OpenAI-compatible endpoint and trains it on groups of
trajectories. Backends are found by name through the ``artsdk.backends`` entry-point group,
so ``backend = "remote"`` in the config swaps one for another without a code change:

```toml
[project.entry-points."artsdk.backends"]
mine = "my_package.backend:MyBackend"
```
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any, Iterator, Optional, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import BackendError
from .trajectory.records import Group, Trajectory

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


class OpenSession(Protocol):
    """An open training session as the layers below the run see it: the model, its backend and
    endpoint, the step it is at, the run it files under. ``art.session`` opens one (a
    ``Session``, ``artsdk/run/session.py``)."""

    model: TrainableModel
    backend: Backend
    endpoint: Endpoint
    step: int
    run_id: str
    trackers: list[Any]

    def next_gather(self) -> int:
        """Count a gather at the current step; its number among them (sampling seeds differ)."""
        ...

    async def train(self, groups: Sequence[Group], **config: Any) -> TrainResult:
        """One training step on ``groups``."""
        ...


_open: list[OpenSession] = []


def current_session() -> Optional[OpenSession]:
    """The innermost open session, or None."""
    return _open[-1] if _open else None


@contextmanager
def opened(run: OpenSession) -> Iterator[OpenSession]:
    """``run`` is the current session inside the block (``art.session`` uses this)."""
    _open.append(run)
    try:
        yield run
    finally:
        _open.remove(run)
