"""The learning loop two tests share: gather -> train -> hot-swap -> gather with the tiny
model, until it says the word it is rewarded for (token id 300)."""

from typing import Any, Callable

import artsdk as art

WORD = 300


@art.reward
def said_word(t: art.Trajectory) -> float:
    ids = t.calls[0].choices[0].token_ids
    return sum(1 for x in ids if x == WORD) / len(ids)


async def learn_to_say(run: art.Session, answer: art.Rollout, check: Callable[[list[Any], int], None],
                       steps: int = 15) -> list[float]:
    """The mean reward of each step's gather (8 x 8 rollouts) until it passes 0.8;
    ``check(calls, step)`` looks at every step's first calls."""
    curve = []
    for step in range(steps):
        groups = await art.gather(answer, range(8), group_size=8, rewards=[said_word])
        curve.append(sum(g.mean for g in groups) / len(groups))
        check([t.calls[0] for g in groups for t in g], step)
        if curve[-1] > 0.8:
            break
        result = await run.train(groups)
        assert result.trained and result.step == step + 1 and result.checkpoint.endswith(f"checkpoints/{step + 1}")
    return curve
