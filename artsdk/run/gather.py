"""``art.gather``: run a rollout over many scenarios at once and return scored groups."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional, Sequence

import anyio

from ..backend import current_session
from ..capture.sentinel import ESCAPED
from ..errors import RewardError, RolloutError, StoreError, first_error
from ..rewards.functions import RewardLike, score
from ..rollout.decorator import Args, Rollout
from ..trajectory.records import Group, new_id
from .progress import Progress

log = logging.getLogger("artsdk")


class Gathered(list):  # type: ignore[type-arg]
    """The groups ``gather`` returns (a list), with what filling them took: ``drawn``
    scenarios run, ``dropped`` groups left out for having no signal (stored all the same)."""

    drawn: int = 0
    dropped: int = 0


def _as_call(scenario: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(scenario, Args):
        return scenario.args, scenario.kwargs
    return (scenario,), {}


async def gather(
    rollout: Rollout[Any],
    scenarios: Iterable[Any],
    *,
    group_size: int = 1,
    rewards: Optional[Sequence[RewardLike]] = None,
    concurrency: Optional[int] = None,
    retries: int = 0,
    timeout: Optional[float] = None,
    progress: Optional[bool] = None,
    store: Any = None,
    signal_groups: Optional[int] = None,
    max_scenarios: Optional[int] = None,
) -> Gathered:
    """Run ``rollout`` ``group_size`` times on every scenario, at most ``concurrency`` at
    once; score each group with ``rewards`` (default: the rollout's own); store every
    trajectory; return one ``art.Group`` per scenario, in scenario order.

    - A scenario is passed as the rollout's one argument; use ``art.Args(a, b, k=1)`` for more.
    - A rollout that raises (or runs past ``timeout`` seconds) is retried up to ``retries``
      times; every attempt is stored, the last one is the group's member.
    - A group whose rewards are all equal has ``no_signal=True`` and is counted in the log.
    - A reward that raises or returns a non-number raises RewardError once everything has
      been stored.
    - Dynamic sampling: with ``signal_groups=N``, scenarios are drawn from ``scenarios`` (an
      iterable, endless or not) until N groups have signal (rewards that differ), at most
      ``max_scenarios`` of them (4 N by default); only groups with signal are returned (when
      none had any, the tied groups are, so a step on them says there was nothing to learn).
      The result's ``drawn`` and ``dropped`` say what that took; every group is stored.

    ``store`` is an ``art.Store``, or ``False`` to keep nothing (tests, dry runs).
    """
    if signal_groups is not None:
        return await _with_signal(rollout, scenarios, signal_groups, max_scenarios, group_size=group_size,
                                  rewards=rewards, concurrency=concurrency, retries=retries, timeout=timeout,
                                  progress=progress, store=store)
    from ..config import settings
    from ..store import default_store

    if not isinstance(rollout, Rollout):
        raise RolloutError(f"gather needs a function decorated with @art.rollout, got {rollout!r}")
    if group_size < 1:
        raise RolloutError(f"group_size must be at least 1, got {group_size}")
    if retries < 0:
        raise RolloutError(f"retries must be 0 or more, got {retries}")
    cfg = settings()
    scenario_list = list(scenarios)
    reward_fns = list(rollout.rewards if rewards is None else rewards)
    db = None if store is False else (store or default_store())
    limit = concurrency or cfg.concurrency
    slots = anyio.Semaphore(limit)
    threads = anyio.CapacityLimiter(limit)
    bar = Progress(f"gather {rollout.name}", total=len(scenario_list) * group_size, unit="rollout", enabled=progress)
    errors, rewards_seen = 0, []
    groups: list[Optional[Group]] = [None] * len(scenario_list)
    reward_errors: list[RewardError] = []
    pending_writes: list[Any] = []

    def keep_interrupted(traj: Any) -> None:  # Ctrl-C mid-rollout: stored, marked "Interrupted"
        if db is not None:
            db.submit(traj)

    seeds = _sample_seeds()

    async def one(group: Group, g: int, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        nonlocal errors
        for attempt in range(retries + 1):
            async with slots:
                traj = await rollout.run(args, kwargs, timeout=timeout, limiter=threads, interrupted=keep_interrupted,
                                         seed=seeds(g, index, attempt), group_id=group.id, group_index=index,
                                         attempt=attempt)
            if traj.error is None or attempt == retries:
                break
            if db is not None:  # failed attempts are kept too
                pending_writes.append(db.submit(traj))
        group.trajectories[index] = traj
        errors += traj.error is not None
        bar.update(1, errors=errors or None)

    async def run_group(i: int, scenario: Any) -> None:
        args, kwargs = _as_call(scenario)
        group = Group(id=new_id(), rollout=rollout.name, scenario=scenario)
        group.trajectories = [None] * group_size  # type: ignore[list-item]
        try:
            async with anyio.create_task_group() as tg:
                for k in range(group_size):
                    tg.start_soon(one, group, i, k, args, kwargs)
        except BaseException:
            if db is not None:  # the members that finished before the group was stopped, unscored
                done = [t for t in group.trajectories if t is not None]
                if done:
                    db.submit(done)
            raise
        try:
            await score(group.trajectories, reward_fns)
        except RewardError as e:
            reward_errors.append(e)
            for t in group.trajectories:
                t.warnings.append(str(e))
        rewards_seen.extend(group.rewards)
        if rewards_seen:
            bar.update(0, reward=sum(rewards_seen) / len(rewards_seen))
        if db is not None:
            try:
                await db.asave(group.trajectories, groups=[group])
            except StoreError as e:  # the group is returned all the same; the error says where its data went
                log.error("%s: a group was not stored: %s", rollout.name, e)
                for t in group.trajectories:
                    t.warnings.append(f"not stored: {e}")
        groups[i] = group

    try:
        async with anyio.create_task_group() as tg:
            for i, scenario in enumerate(scenario_list):
                tg.start_soon(run_group, i, scenario)
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    finally:
        bar.close()
        if pending_writes:
            from ..store import wait

            for f in pending_writes:  # failed attempts: a write that fails is logged by the store, not raised here
                try:
                    await wait(f)
                except StoreError:
                    pass

    done = Gathered(g for g in groups if g is not None)
    done.drawn = len(scenario_list)
    _report(rollout.name, done)
    if reward_errors:
        extra = f" (and {len(reward_errors) - 1} more)" if len(reward_errors) > 1 else ""
        raise RewardError(f"{reward_errors[0]}{extra}; the trajectories were stored unscored")
    return done


async def _with_signal(rollout: Rollout[Any], scenarios: Iterable[Any], wanted: int, cap: Optional[int],
                       **options: Any) -> Gathered:
    """Gather rounds of scenarios drawn from ``scenarios`` until ``wanted`` groups have signal
    (or ``cap`` scenarios were drawn, or there are no more): DAPO's dynamic sampling. When no
    group drawn had signal, the tied groups come back after all: a step on them moves nothing
    and says why (``run.train``'s ``reason``), where an empty batch would be no step at all."""
    if wanted < 1:
        raise RolloutError(f"signal_groups must be at least 1, got {wanted}")
    cap = 4 * wanted if cap is None else cap
    if cap < wanted:
        raise RolloutError(f"max_scenarios ({cap}) must be at least signal_groups ({wanted})")
    source = iter(scenarios)
    out, tied = Gathered(), []
    while len(out) < wanted and out.drawn < cap:
        take = min(wanted - len(out), cap - out.drawn)
        batch = [s for _, s in zip(range(take), source)]
        if not batch:
            break  # the scenarios ran out
        got = await gather(rollout, batch, **options)
        out.drawn += len(batch)
        tied += [g for g in got if g.no_signal]
        out.extend(g for g in got if not g.no_signal)
    if len(out) < wanted:
        log.warning("%s: %d of the %d groups with signal asked for, after drawing %d scenarios (%d had none)%s",
                    rollout.name, len(out), wanted, out.drawn, len(tied),
                    "" if out else "; the tied groups are returned, and a step on them moves nothing")
    if out:
        out.dropped = len(tied)
    else:
        out.extend(tied)
    return out


def _sample_seeds() -> Any:
    """In a session: (group, sample, attempt) -> the seed that sample's calls to the trainable
    model sample with, from the run's seed (the model's ``train.seed``), its step and how many
    gathers that step made, so a run samples the same way every time it runs. Outside: None."""
    import hashlib

    run = current_session()
    if run is None:
        return lambda *_: None
    base = f"{run.model.config.get('train', {}).get('seed', 0)}:{run.step}:{run.next_gather()}"

    def seed(group: int, sample: int, attempt: int) -> int:
        digest = hashlib.blake2b(f"{base}:{group}:{sample}:{attempt}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") % 2**31

    return seed


def _inside_tool_call(message: Any) -> bool:
    """An answer cut at max_tokens inside a tool call: its markup opened and not closed, or a
    tool call the server had begun (a prose answer cut short is not one)."""
    if not isinstance(message, dict):
        return False
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    return bool(message.get("tool_calls")) or text.rfind("<tool_call>") > text.rfind("</tool_call>")


def _report(name: str, groups: list[Group]) -> None:
    trajs = [t for g in groups for t in g.trajectories]
    silent = sum(1 for t in trajs if not t.calls and t.error is None)
    if silent:
        log.warning("%s: %d of %d rollouts made no LLM call that could be captured; they "
                    "cannot be trained on. Call the model with the openai or litellm client "
                    "inside the decorated function.", name, silent, len(trajs))
    escaped = sum(1 for t in trajs if any(w.startswith(ESCAPED) for w in t.warnings))
    if escaped:
        log.warning("%s: %d of %d rollouts made LLM calls that escaped capture (see their warnings): their "
                    "trajectories are partial. Set strict_capture = true to make that an error.",
                    name, escaped, len(trajs))
    with_tools = [c for t in trajs for c in t.agent_calls if c.tools and c.choices]
    cut = sum(1 for c in with_tools if c.choices[0].finish_reason == "length" and _inside_tool_call(c.choices[0].message))
    if cut:  # a tool call cut short is not parsed as one: the agent saw prose, silently
        log.warning("%s: %d of %d answers offered tools were cut at max_tokens (a tool call cut short is not "
                    "parsed as a call); raise max_tokens if the answers need the room", name, cut, len(with_tools))
    no_signal = sum(1 for g in groups if g.no_signal)
    errors = sum(g.errors for g in groups)
    if no_signal or errors:
        log.info("%s: %d groups, %d with no signal (all rewards equal), %d failed rollouts",
                 name, len(groups), no_signal, errors)
