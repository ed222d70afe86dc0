"""Rewards: plain callables, weights, dict values, group rewards, and clear errors."""

import math

import pytest

import artsdk as art

pytestmark = pytest.mark.anyio
from artsdk.rewards import score
from artsdk.testing import trajectory


def convo(answer):
    return [{"role": "user", "content": "say yes"}, {"role": "assistant", "content": answer}]


@art.reward
def says_yes(traj: art.Trajectory) -> float:
    return 1.0 if traj.last_message["content"] == "yes" else 0.0


def test_decorated_reward_is_a_plain_callable():
    assert says_yes(trajectory(convo("yes"))) == 1.0
    assert says_yes(trajectory(convo("no"))) == 0.0
    assert says_yes.name == "says_yes" and says_yes.weight == 1.0 and not says_yes.group
    assert says_yes.__name__ == "says_yes"


async def test_weights_dicts_and_async_rewards_sum_up():
    @art.reward(weight=0.5)
    async def judged(traj):
        return 0.8

    @art.reward(name="parts")
    def split(traj):
        return {"format": 0.25, "length": -0.5}

    t = trajectory(convo("yes"))
    await score([t], [says_yes, judged, split])
    assert t.rewards == {"says_yes": 1.0, "judged": 0.8, "parts.format": 0.25, "parts.length": -0.5}
    assert t.reward == pytest.approx(1.0 + 0.5 * 0.8 + 0.25 - 0.5)


async def test_group_reward_ranks_within_the_group():
    @art.reward(group=True)
    def shortest_wins(trajs):
        lengths = [len(t.last_message["content"]) for t in trajs]
        return [1.0 if n == min(lengths) else 0.0 for n in lengths]

    ts = [trajectory(convo(a)) for a in ("long answer", "ok", "medium")]
    await score(ts, [shortest_wins])
    assert [t.reward for t in ts] == [0.0, 1.0, 0.0]
    group = art.Group(trajectories=ts)
    assert not group.no_signal and group.mean == pytest.approx(1 / 3)


@pytest.mark.parametrize("bad,fragment", [
    (math.nan, "returned nan"), (math.inf, "returned inf"), (None, "returned None"),
    ("1.0", "returned '1.0' (str)"), (True, "returned True (bool)"),
])
async def test_bad_reward_values_name_the_reward_and_trajectory(bad, fragment):
    @art.reward
    def broken(traj):
        return bad

    t = trajectory(convo("yes"))
    with pytest.raises(art.RewardError) as e:
        await score([t], [broken])
    assert "reward 'broken'" in str(e.value) and fragment in str(e.value)
    assert t.id[:8] in str(e.value)


async def test_reward_that_raises_and_group_reward_of_wrong_length():
    @art.reward
    def crashes(traj):
        return traj.outcome["missing"]

    with pytest.raises(art.RewardError, match=r"reward 'crashes' raised TypeError"):
        await score([trajectory(convo("x"))], [crashes])

    @art.reward(group=True)
    def short(trajs):
        return [1.0]

    with pytest.raises(art.RewardError, match=r"one value per trajectory \(2\)"):
        await score([trajectory(convo("a")), trajectory(convo("b"))], [short])


async def test_failed_trajectories_are_not_scored_and_duplicate_names_refused():
    ok, failed = trajectory(convo("yes")), trajectory(convo("yes"), error="boom")
    await score([ok, failed], [says_yes])
    assert ok.reward == 1.0 and failed.reward is None and failed.rewards == {}
    with pytest.raises(art.RewardError, match="two rewards are named"):
        await score([ok], [says_yes, art.reward(says_yes.fn)])


def test_testing_helper_builds_calls_and_validates_messages():
    t = trajectory([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
                    {"role": "assistant", "content": "a2"}], outcome=3, token_ids=[1, 2], logprobs=[-1, -2])
    assert len(t.calls) == 2 and t.calls[1].messages[-1]["content"] == "u2"
    assert t.messages[-1]["content"] == "a2" and t.calls[1].choices[0].trainable
    with pytest.raises(art.TrajectoryError, match=r"messages\[1\] has role 'robot'"):
        trajectory([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])
    with pytest.raises(art.TrajectoryError, match="must be a list of chat messages"):
        trajectory("hello")
    with pytest.raises(art.TrajectoryError, match=r"messages\[0\] is a tool message without"):
        trajectory([{"role": "tool", "content": "r"}])


async def test_a_reward_reads_the_same_scenario_in_memory_and_from_the_store(tmp_path):
    """A gather's trajectories hold the objects the rollout was called with; the store gives
    their JSON back: ``scenario_as`` turns either into the user's type."""
    from dataclasses import dataclass

    from pydantic import BaseModel

    @dataclass
    class Review:
        text: str
        label: str

    class Board(BaseModel):
        cells: list[int]

    @art.rollout
    def label(review: Review, board: Board) -> str:
        return "positive"

    @art.reward
    def correct(t: art.Trajectory) -> float:
        return float(t.outcome == t.scenario_as(Review, "review").label) + sum(t.scenario_as(Board, "board").cells)

    store = art.Store(tmp_path / "s.db")
    (group,) = await art.gather(label, [art.Args(Review("great food", "positive"), Board(cells=[1, 2]))],
                                rewards=[correct], store=store)
    (live,) = group.trajectories
    (back,) = store.trajectories()
    assert isinstance(live.scenario["review"], Review) and isinstance(back.scenario["review"], dict)
    assert correct(live) == correct(back) == 4.0  # it failed on the stored one: a dict has no .label
    with pytest.raises(art.TrajectoryError, match="no argument 'film'"):
        back.scenario_as(Review, "film")
    store.close()
