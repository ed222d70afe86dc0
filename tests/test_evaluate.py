"""``run.evaluate``: a gather on held-out scenarios that trains nothing, against the tiny model
served by a real local backend and a real SQLite store -- its figures, what it stores, that no
training step or count of groups ever takes its trajectories."""

import math

import anyio
import pytest

import artsdk as art

pytest.importorskip("torch")


@pytest.fixture
def home(tmp_path):
    art.configure(home=str(tmp_path), store=str(tmp_path / "store.db"), progress=False)
    yield tmp_path
    art.configure(home=None, store=None, progress=None)


def agent_of(client):
    @art.rollout
    async def answer(n: int, *, temperature: float = 1.0) -> dict:
        if n == 13:
            raise RuntimeError("scenario 13 breaks the agent")
        r = await client.chat.completions.create(model="judge", messages=[{"role": "user", "content": f"item {n}"}],
                                                 max_tokens=4, temperature=temperature)
        return {"n": n, "text": r.choices[0].message.content, "temperature": temperature}

    return answer


@art.reward
def even(t: art.Trajectory) -> float:
    return 1.0 if t.outcome["n"] % 2 == 0 else 0.0


@art.reward
def small(t: art.Trajectory) -> float:
    return 1.0 / (1 + t.outcome["n"])


@art.reward
def wordy(t: art.Trajectory) -> float:
    return len(t.outcome["text"] or "") / 100


class Tracker:
    def __init__(self):
        self.logged = []

    def log(self, model, step, metrics):
        self.logged.append((step, metrics))

    def close(self):
        pass


def test_an_evaluation_scores_stores_and_files_itself_with_the_step(home):
    from openai import AsyncOpenAI

    from backends.local import LocalBackend

    async def go():
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
        be = LocalBackend(device="cpu")
        async with art.session(art.TrainableModel("judge", base_model="tiny", project="ev"), backend=be) as run:
            tracker = Tracker()
            run.trackers.append(tracker)
            agent = agent_of(client)
            result = await run.evaluate(agent, [10, 11, 12, 13, 14], rewards=[even, small], name="held-out",
                                        metrics={"at_zero": lambda t: t.outcome["temperature"] == 0.0},
                                        temperature=0.0)
            groups = await art.gather(agent, [1, 2], group_size=4, rewards=[even, wordy])
            trained = await run.train(groups)
        await be.close()
        await client.close()
        return result, tracker, trained

    from artsdk.viewer.queries import Views

    result, tracker, trained = anyio.run(go)
    rewards = [1 + 1 / 11, 1 / 12, 1 + 1 / 13, 1 + 1 / 15]  # 13 failed: counted, not scored
    mean = sum(rewards) / 4
    se = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3) / 2
    assert result.step == 0 and result.scenarios == 5 and result.failed == 1
    assert result.reward == pytest.approx(mean) and result.reward_se == pytest.approx(se)
    assert result.parts == pytest.approx({"even": 0.75, "small": (1 / 11 + 1 / 12 + 1 / 13 + 1 / 15) / 4})
    assert result.metrics == {"at_zero": 1.0}  # the sampling argument reached every call of the agent
    assert [t.outcome["n"] for t in result.trajectories if t.error is None] == [10, 11, 12, 14]
    assert tracker.logged[0] == (0, result.figures()) and result.figures()["eval/held-out/failed"] == 1.0

    with art.Store(str(home / "store.db")) as store:
        stored = store.trajectories(project="ev", model="judge")
        evaluated = [t for t in stored if t.metadata.get("evaluation") == "held-out"]
        assert len(evaluated) == 5 and all(t.group_id is None and t.step == 0 for t in evaluated)
        assert len(store.groups(project="ev", model="judge", step=0)) == 2  # the training groups alone
        assert [s["step"] for s in store.steps("ev", "judge")] == [1]  # the training steps: step 0 is none
        views = Views(store)
        (figures,) = [m for m in views.curve("ev", "judge")["metrics"] if m["step"] == 0]
        assert figures["eval/held-out/reward"] == pytest.approx(mean)
        assert figures["eval/held-out/part/even"] == 0.75 and figures["eval/held-out/at_zero"] == 1.0
    assert trained.trained and trained.step == 1 and trained.groups_trained + trained.groups_skipped == 2
