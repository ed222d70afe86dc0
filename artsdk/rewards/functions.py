"""Reward functions: plain callables that score trajectories.

```python
@art.reward
def won(traj: art.Trajectory) -> float:
    return 1.0 if traj.outcome["winner"] == "x" else 0.0

@art.reward(weight=0.1)
async def short(traj): return -len(traj.calls) / 10        # async works too

@art.reward
def parts(traj) -> dict[str, float]:                        # several named values, summed
    return {"format": 0.2, "correct": 1.0}

@art.reward(group=True)                                     # sees the whole group at once
def rank(trajs: list[art.Trajectory]) -> list[float]: ...
```

A decorated reward stays a plain callable, so ``won(traj)`` works in a unit test.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Optional, Sequence, Union, overload

from ..errors import RewardError, first_error
from ..trajectory.records import Trajectory


class Reward:
    """A reward function and how it counts. Calling it calls the function unchanged."""

    def __init__(self, fn: Callable[..., Any], *, name: Optional[str] = None, weight: float = 1.0,
                 group: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"@art.reward needs a function, got {fn!r}")
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RewardError(f"reward {name or fn.__name__!r}: weight must be a finite number, got {weight!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")
        self.weight = float(weight)
        self.group = group
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        kind = "group reward" if self.group else "reward"
        return f"<{kind} {self.name!r} weight={self.weight}>"


RewardLike = Union[Reward, Callable[..., Any]]


@overload
def reward(fn: Callable[..., Any]) -> Reward: ...
@overload
def reward(*, name: Optional[str] = None, weight: float = 1.0, group: bool = False) -> Callable[[Callable[..., Any]], Reward]: ...


def reward(fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
           weight: float = 1.0, group: bool = False) -> Any:
    """Declare a reward function (see the module docs). ``weight`` scales its value in the
    trajectory's total; ``group=True`` makes it score a whole group at once."""
    if fn is not None:
        return Reward(fn, name=name, weight=weight, group=group)
    return lambda f: Reward(f, name=name, weight=weight, group=group)


def as_reward(r: RewardLike) -> Reward:
    return r if isinstance(r, Reward) else Reward(r)


def _number(value: Any, reward: Reward, traj: Trajectory, key: Optional[str] = None) -> float:
    what = f"reward {reward.name!r}" + (f" (key {key!r})" if key else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # numpy scalars and friends convert cleanly; strings and None do not
        if hasattr(value, "__float__") and not isinstance(value, (str, bytes, bool)):
            value = float(value)
        else:
            raise RewardError(
                f"{what} returned {value!r} ({type(value).__name__}) for trajectory {traj.id[:8]}; "
                f"a reward must return a float or a dict of floats"
            )
    value = float(value)
    if not math.isfinite(value):
        raise RewardError(f"{what} returned {value} for trajectory {traj.id[:8]}; rewards must be finite")
    return value


def _apply(traj: Trajectory, reward: Reward, value: Any) -> None:
    if isinstance(value, dict):
        if not value:
            raise RewardError(f"reward {reward.name!r} returned an empty dict for trajectory {traj.id[:8]}")
        for k, v in value.items():
            traj.rewards[f"{reward.name}.{k}"] = _number(v, reward, traj, str(k))
    else:
        traj.rewards[reward.name] = _number(value, reward, traj)


def _total(traj: Trajectory, rewards: Sequence[Reward]) -> float:
    total = 0.0
    for r in rewards:
        if r.name in traj.rewards:
            total += r.weight * traj.rewards[r.name]
        else:
            prefix = r.name + "."
            total += r.weight * sum(v for k, v in traj.rewards.items() if k.startswith(prefix))
    return total


async def _call(reward: Reward, arg: Any, what: str) -> Any:
    try:
        value = reward.fn(arg)
        if inspect.isawaitable(value):
            value = await value
        return value
    except RewardError:
        raise
    except Exception as e:
        raise RewardError(f"reward {reward.name!r} raised {type(e).__name__}: {e} for {what}") from e


async def score(trajectories: Sequence[Trajectory], rewards: Sequence[RewardLike]) -> None:
    """Apply rewards to trajectories in place (``rewards``, ``reward``). Group rewards see
    ``trajectories`` as one group. Failed trajectories (``error`` set) are not scored.

    Raises RewardError naming the reward and the trajectory when a reward raises or returns
    something that is not a finite number.
    """
    rs = [as_reward(r) for r in rewards]
    names = [r.name for r in rs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise RewardError(f"two rewards are named {dup}; give one a name=")
    ok = [t for t in trajectories if t.error is None]
    for r in rs:
        if r.group:
            if not ok:
                continue
            values = await _call(r, ok, f"group of {len(ok)} starting with trajectory {ok[0].id[:8]}")
            if not isinstance(values, (list, tuple)) or len(values) != len(ok):
                raise RewardError(
                    f"group reward {r.name!r} must return one value per trajectory "
                    f"({len(ok)}), got {values!r:.80}"
                )
            for t, v in zip(ok, values):
                _apply(t, r, v)
        elif r.is_async and len(ok) > 1:
            # async rewards (LLM judges) of a group run at once
            import anyio

            values: dict[int, Any] = {}

            async def one(i: int, t: Trajectory, r: Reward = r) -> None:
                values[i] = await _call(r, t, f"trajectory {t.id[:8]}")

            try:
                async with anyio.create_task_group() as tg:
                    for i, t in enumerate(ok):
                        tg.start_soon(one, i, t)
            except BaseExceptionGroup as eg:
                raise first_error(eg) from None
            for i, t in enumerate(ok):
                _apply(t, r, values[i])
        else:
            for t in ok:
                _apply(t, r, await _call(r, t, f"trajectory {t.id[:8]}"))
    for t in ok:
        if rs:
            t.reward = _total(t, rs)
