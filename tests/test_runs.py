"""Runs you can tell apart and runs that repeat: every session is a run (trajectories, steps
and checkpoints filed under it), a fresh start never mixes with an earlier run, a resumed one
continues it; and a run samples the same tokens whatever the batching, so running it again
gives the same result. The tiny model on the local backend, a real SQLite store."""

import pytest
import torch
from openai import AsyncOpenAI

import artsdk as art
from backends.local import LocalBackend

pytestmark = pytest.mark.anyio


def agent(client):
    @art.rollout
    async def say(i: int) -> list[int]:
        r = await client.chat.completions.create(model="r", messages=[{"role": "user", "content": f"say {i}"}],
                                                 max_tokens=6, temperature=1.0)
        return r.choices[0].model_extra["token_ids"]

    return say


@art.reward
def low(t: art.Trajectory) -> float:
    return -sum(t.outcome) / 500


async def run_once(home, concurrency, resume=True, steps=2):
    be = LocalBackend(device="cpu", home=str(home), max_batch=concurrency)
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
    say = agent(client)
    model = art.TrainableModel("r", base_model="tiny", config={"train": {"learning_rate": 1e-2, "seed": 3}})
    sampled = []
    async with art.session(model, backend=be, resume=resume) as run:
        for _ in range(steps):
            groups = await art.gather(say, range(4), group_size=4, rewards=[low], concurrency=concurrency)
            sampled.append([t.outcome for g in groups for t in g])
            await run.train(groups)
        weights = torch.cat([p.detach().flatten().clone() for n, p in be.models["r"].model.named_parameters()
                             if ".policy." in n])
        info = (run.run_id, run.step, run.resumed, be.models["r"].checkpoints.folder)
    await client.close()
    await be.close()
    return sampled, weights, info


async def test_a_run_samples_the_same_tokens_whatever_the_batching(tmp_path, art_store):
    a, wa, _ = await run_once(tmp_path / "a", concurrency=64)  # everything in one batch
    b, wb, _ = await run_once(tmp_path / "b", concurrency=3)  # three at a time
    assert a == b  # the same tokens at every step (they differed with the batching before)
    assert (wa - wb).abs().max() < 1e-3 * wa.abs().max()  # so the same adapter (batching moves logprobs by float noise)
    assert len({tuple(x) for x in a[0]}) > 8  # and samples, not one answer repeated


async def test_fresh_runs_are_told_apart_and_resumed_runs_continue(tmp_path, art_store):
    home = tmp_path / "home"
    _, _, (first, step, resumed, folder) = await run_once(home, 8, resume=False)
    assert step == 2 and not resumed
    _, _, (second, step, resumed, _) = await run_once(home, 8, resume=False)  # fresh: from the base model
    assert second != first and step == 2 and not resumed
    assert [p.name.startswith("checkpoints.") for p in folder.parent.iterdir() if p.name != "checkpoints"]
    assert any(p.name.startswith("checkpoints.") for p in folder.parent.iterdir())  # moved aside, not deleted
    _, _, (third, step, resumed, _) = await run_once(home, 8, resume=True, steps=1)  # continues the second
    assert third == second and step == 3 and resumed
    runs = {r["run"]: r for r in art_store.runs(project=None, model="r")}
    assert set(runs) == {first, second} and runs[second]["last_step"] == 3 and runs[first]["last_step"] == 2
    # nothing mixes: each run's trajectories and steps are its own, step numbers overlapping
    assert art_store.count(run=first) == 2 * 16 and art_store.count(run=second) == 3 * 16
    assert [s["step"] for s in art_store.steps(art.settings().project, "r", run=first)] == [1, 2]
    assert [s["step"] for s in art_store.steps(art.settings().project, "r")] == [1, 2, 3]  # the newest run
