"""``run.evaluate``: how the model at the current step does on held-out scenarios -- a gather
that trains nothing. Its trajectories are stored, marked as this evaluation's
(``metadata["evaluation"]``) and in no group, so no training step and no count of a step's
groups ever takes them; its figures are filed with the step (``eval/<name>/...`` in the step's
metrics, the trackers too), which the viewer draws as a curve of its own.

    async with art.session(model) as run:
        before = await run.evaluate(play, held_out, rewards=[won], temperature=0.0)
        ...
        print(before.reward, "±", before.reward_se, before.parts, before.metrics["solved"])
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Sequence

import anyio
from pydantic import BaseModel, ConfigDict, Field

from ..backend import OpenSession
from ..rollout.decorator import Args, Rollout
from ..store import default_store
from ..trajectory.records import Trajectory
from .gather import gather


class Evaluation(BaseModel):
    """The figures of one evaluation: the mean reward and its standard error over the scenarios
    (failed rollouts left out, counted in ``failed``), each named reward part's mean, each of
    ``metrics``' mean (a share, for a yes/no one), and the trajectories (in scenario order)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    step: int
    scenarios: int
    reward: float
    reward_se: float
    failed: int = 0
    parts: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    trajectories: list[Trajectory] = Field(default_factory=list, repr=False)

    def figures(self) -> dict[str, float]:
        """As filed with the step: ``eval/<name>/reward`` and the rest."""
        out = {"reward": self.reward, "reward_se": self.reward_se, "scenarios": float(self.scenarios),
               "failed": float(self.failed), **{f"part/{k}": v for k, v in self.parts.items()}, **self.metrics}
        return {f"eval/{self.name}/{k}": v for k, v in out.items()}


async def evaluate(run: OpenSession, agent: Rollout[Any], scenarios: Iterable[Any], *,
                   rewards: Optional[Sequence[Any]] = None, name: str = "eval",
                   metrics: Optional[dict[str, Callable[[Trajectory], Any]]] = None,
                   concurrency: Optional[int] = None, **arguments: Any) -> Evaluation:
    """Run ``agent`` once on each scenario with the model at its current step, score it, store
    it as an evaluation and file its figures with the step. ``arguments`` go to every call of
    the agent (``temperature=0.0`` for greedy answers, where the agent takes one); ``metrics``
    are figures of one trajectory (``{"solved": lambda t: t.outcome["won"]}``), averaged."""
    calls = [Args(*s.args, **{**s.kwargs, **arguments}) if isinstance(s, Args) else Args(s, **arguments)
             for s in scenarios]
    groups = await gather(agent, calls, group_size=1, rewards=rewards, concurrency=concurrency, store=False)
    trajs = [t for g in groups for t in g.trajectories]
    for t in trajs:  # an evaluation's, in no group: never trained on, never counted as a step's group
        t.metadata["evaluation"] = name
        t.group_id = t.group_index = None
    scored = [t for t in trajs if t.error is None and t.reward is not None]
    rewards_ = [float(t.reward) for t in scored]  # type: ignore[arg-type]
    mean = sum(rewards_) / len(rewards_) if rewards_ else math.nan
    se = (math.sqrt(sum((r - mean) ** 2 for r in rewards_) / (len(rewards_) - 1)) / math.sqrt(len(rewards_))
          if len(rewards_) > 1 else math.nan)
    parts: dict[str, list[float]] = {}
    for t in scored:
        for k, v in t.rewards.items():
            parts.setdefault(k, []).append(v)
    figures = {k: sum(float(f(t)) for t in scored) / len(scored) for k, f in (metrics or {}).items()} if scored else {}
    result = Evaluation(name=name, step=run.step, scenarios=len(trajs), reward=mean, reward_se=se,
                        failed=len(trajs) - len(scored), parts={k: sum(v) / len(v) for k, v in parts.items()},
                        metrics=figures, trajectories=trajs)
    store = default_store()
    await store.asave(trajs)
    await anyio.to_thread.run_sync(lambda: store.add_step_metrics(run.model.project, run.model.name, run.step,
                                                                  result.figures(), run.run_id))
    for tracker in run.trackers:
        await anyio.to_thread.run_sync(tracker.log, run.model, run.step, result.figures())
    return result
