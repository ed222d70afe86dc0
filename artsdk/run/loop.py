"""``run.loop``: rollouts never wait for training. Gathering goes on while earlier steps train,
never so far ahead that a trained token would be more than ``max_policy_lag`` steps old.

    async with art.session(model) as run:
        async for result in run.loop(play, games, group_size=8, rewards=[won], steps=20,
                                     scenarios_per_step=8, max_policy_lag=1):
            print(result.step, result.metrics["reward_mean"], result.metrics["loop/trainer_idle_s"])

One task gathers a step's groups after another; the loop trains them in order and yields
each step's ``TrainResult``. Batch k starts gathering once k - ``max_policy_lag`` steps of
this loop are done, so its calls are answered by a model at most that many steps older than
the one that trains on them -- and the trainer gets the same bound (``max_policy_lag``), which
turns any older token into context. With
``max_policy_lag=0`` a batch is gathered only after the step before it trained: the sequential
loop, step for step the same under a seed. ``signal_groups`` fills each step with that many
groups that have signal (``art.gather``'s dynamic sampling).

On the local backend with one device the model is generating or training, not both: what
overlaps is the rollouts' waiting (their tools, their environments, other models) with
training. On the remote and ray backends inference and training run on their own devices, at
the same time.

Each result's metrics add, under ``loop/``: ``sampler_idle_s`` (the gatherer waiting for the
lag bound), ``trainer_idle_s`` (the trainer waiting for a batch), ``queue_depth`` (batches
ready when the step began), ``gathered_at_step`` (the model's step when its batch began),
``scenarios_drawn`` and ``groups_dropped`` (dynamic sampling). A step the backend refuses
(bad data: nothing moved) is yielded as not trained, with its reason, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Optional, Sequence

from ..backend import OpenSession, TrainResult
from ..errors import RolloutError, TrainingError, TrajectoryError
from ..rollout.decorator import Rollout
from .gather import gather


@dataclass
class _Batch:
    index: int
    groups: list[Any]
    at_step: int  # the model's step when the batch began gathering
    drawn: int
    dropped: int
    waited: float  # seconds the gatherer waited for the lag bound before it


async def loop(run: OpenSession, agent: Rollout[Any], scenarios: Iterable[Any], *, group_size: int,
               steps: int, scenarios_per_step: int, rewards: Optional[Sequence[Any]] = None,
               max_policy_lag: int = 1, signal_groups: Optional[int] = None,
               max_scenarios: Optional[int] = None, **options: Any) -> AsyncIterator[TrainResult]:
    """See the module docs. ``options`` go to ``art.gather`` (concurrency, retries, timeout...)."""
    if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 0:
        raise RolloutError(f"max_policy_lag must be a whole number of steps, 0 or more; got {max_policy_lag!r}")
    if steps < 0 or scenarios_per_step < 1:
        raise RolloutError("steps must be 0 or more and scenarios_per_step at least 1")
    source = iter(scenarios)
    done = 0  # steps of this loop trained (or refused): the model is at most this many steps ahead
    ready: "asyncio.Queue[Any]" = asyncio.Queue()
    trained = asyncio.Condition()

    async def gatherer() -> None:
        for k in range(steps):
            t0 = time.monotonic()
            async with trained:  # batch k begins once k - lag of the steps before it are done
                await trained.wait_for(lambda: done >= k - max_policy_lag)
            waited = time.monotonic() - t0
            at = run.step
            if signal_groups is not None:
                groups = await gather(agent, source, group_size=group_size, rewards=rewards,
                                      signal_groups=signal_groups, max_scenarios=max_scenarios, **options)
            else:
                batch = list(itertools.islice(source, scenarios_per_step))
                if not batch:
                    break
                groups = await gather(agent, batch, group_size=group_size, rewards=rewards, **options)
            await ready.put(_Batch(k, groups, at, getattr(groups, "drawn", len(groups)),
                                   getattr(groups, "dropped", 0), waited))
        await ready.put(None)

    task = asyncio.create_task(gatherer())
    try:
        while True:
            t0 = time.monotonic()
            depth = ready.qsize()
            item = await ready.get()
            idle = time.monotonic() - t0
            if item is None:
                break
            figures = {"loop/sampler_idle_s": item.waited, "loop/trainer_idle_s": idle,
                       "loop/queue_depth": float(depth), "loop/gathered_at_step": float(item.at_step),
                       "loop/scenarios_drawn": float(item.drawn), "loop/groups_dropped": float(item.dropped),
                       "loop/max_policy_lag": float(max_policy_lag)}
            result = await _train(run, item.groups, max_policy_lag, figures)  # recorded with the step (trackers too)
            done += 1
            async with trained:
                trained.notify_all()
            yield result
        await task  # its errors, if it had any
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: what it gathered is stored
                pass


async def _train(run: OpenSession, groups: list[Any], max_policy_lag: int, figures: dict[str, float]) -> TrainResult:
    """A step on ``groups``, tokens older than the lag bound trained as context; a step the
    backend refuses for its data (nothing moved) comes back as not trained, with why."""
    try:
        return await run.train(groups, max_policy_lag=max_policy_lag, extra_metrics=figures)
    except (TrajectoryError, TrainingError) as e:  # refused before any weight moved
        return TrainResult(step=run.step, trained=False, reason=f"{type(e).__name__}: {e}", metrics=figures)
