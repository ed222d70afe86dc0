"""The learning loop two tests share: gather -> train -> hot-swap -> gather with the tiny
model, until it says the words it is rewarded for (token ids 300-307).

Eight words, not one: the untrained model says one given token about once in 560, so 64
answers of 6 tokens held none of it about half the time, every group had equal rewards and
step 0 had nothing to learn from. It says one of eight about 3% of the time: some in every
step-0 gather, still far below the 0.8 the loop learns to."""

from typing import Any, Callable

import artsdk as art

WORDS = frozenset(range(300, 308))


@art.reward
def said_word(t: art.Trajectory) -> float:
    ids = t.calls[0].choices[0].token_ids
    return sum(1 for x in ids if x in WORDS) / len(ids)


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
