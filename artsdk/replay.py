"""Replay stored trajectories.

```python
old = store.trajectories(project="ttt", step=3)
rescored = await art.replay.rescore(old, rewards=[won, short])       # no model involved

new = await art.replay.rerun(play, old[0])   # agent code re-run; each LLM call answered
                                             # from the recording, offline
```
"""

from __future__ import annotations

import typing
from typing import Any, Optional, Sequence

from pydantic import TypeAdapter

from .capture.cassette import Cassette, check_same_request, current_cassette
from .errors import ReplayError
from .rewards.functions import RewardLike, score
from .rollout.decorator import Rollout
from .trajectory.records import Group, Trajectory

__all__ = ["rescore", "rescore_groups", "rerun", "check_same_request"]


async def rescore(trajectories: Sequence[Trajectory], rewards: Sequence[RewardLike], *,
                  groups: bool = True) -> list[Trajectory]:
    """Copies of ``trajectories`` scored with ``rewards`` (the originals are left as they
    were). Group rewards see the trajectories of each stored group together when
    ``groups`` is true, else all of them as one group."""
    copies = [t.model_copy(deep=True) for t in trajectories]
    for t in copies:
        t.rewards = {}
        t.reward = None
    if groups:
        by_group: dict[Optional[str], list[Trajectory]] = {}
        for t in copies:
            by_group.setdefault(t.group_id, []).append(t)
        for gid, members in by_group.items():
            if gid is None:
                for t in members:
                    await score([t], rewards)
            else:
                await score(members, rewards)
    else:
        await score(copies, rewards)
    return copies


async def rescore_groups(groups: Sequence[Group], rewards: Sequence[RewardLike]) -> list[Group]:
    """Copies of ``groups`` scored with ``rewards``."""
    out = []
    for g in groups:
        trajs = await rescore(g.trajectories, rewards, groups=False)
        out.append(Group(id=g.id, rollout=g.rollout, scenario=g.scenario, trajectories=trajs))
    return out


def _args_for(rollout: Rollout[Any], scenario: Any) -> dict[str, Any]:
    """Rebuild typed arguments from a stored scenario (JSON) using the function's
    annotations: a dataclass or pydantic ``Game`` comes back as a ``Game``."""
    if not isinstance(scenario, dict):
        raise ReplayError(f"stored scenario {scenario!r:.80} is not a dict of arguments; "
                          f"pass the arguments to rerun() yourself")
    try:
        hints = typing.get_type_hints(rollout.fn)
    except Exception:  # noqa: BLE001 - unresolvable hints: use the stored values as they are
        hints = {}
    out = {}
    for name, value in scenario.items():
        if name not in rollout.signature.parameters:
            raise ReplayError(f"rollout {rollout.name!r} has no parameter {name!r} (stored in the "
                              f"scenario); pass the arguments to rerun() yourself")
        ann = hints.get(name, Any)
        if ann is Any:
            out[name] = value
            continue
        try:
            out[name] = TypeAdapter(ann).validate_python(value)
        except Exception:  # noqa: BLE001 - not rebuildable: keep the stored value
            out[name] = value
    return out


async def rerun(rollout: Rollout[Any], trajectory: Trajectory, *args: Any,
                rewards: Optional[Sequence[RewardLike]] = None, **kwargs: Any) -> Trajectory:
    """Run ``rollout`` again with every LLM call answered from ``trajectory``'s recording,
    in order, with no model or network. Returns the new trajectory, scored with ``rewards``
    (default: the rollout's own).

    The arguments default to the stored scenario. A call whose request differs from the
    recorded one (other messages or tools) raises ReplayError saying which call and how.
    """
    if not args and not kwargs:
        kwargs = _args_for(rollout, trajectory.scenario)
    cassette = Cassette(trajectory.calls, trajectory.id)
    token = current_cassette.set(cassette)
    try:
        new = await rollout.run(args, kwargs, metadata={"replay_of": trajectory.id})
    finally:
        current_cassette.reset(token)
    if new.error is not None and new.error.type == "ReplayError":
        raise ReplayError(new.error.message)
    if cassette.position < len(trajectory.calls) and new.error is None:
        new.warnings.append(
            f"the re-run made {cassette.position} call(s); the recording has {len(trajectory.calls)}"
        )
    await score([new], rollout.rewards if rewards is None else rewards)
    return new
