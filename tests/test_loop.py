"""``run.loop``: gathering goes on while earlier steps train, never past the lag bound; with a
bound of 0 it is the sequential loop, step for step; a failed rollout or a refused step does
not stop it; dynamic sampling fills a step with groups that have signal. The local backend,
the tiny model (and the same loop on the remote and ray backends)."""

import asyncio

import pytest
import torch
from openai import AsyncOpenAI

import artsdk as art
from backends.local import LocalBackend
from tests.conftest import on_ray

pytestmark = pytest.mark.anyio


def make_agent(client, delay: float = 0.0):
    @art.rollout
    async def agent(q: str) -> str:
        if q == "raise":
            raise RuntimeError("the tool broke")
        if delay:
            await asyncio.sleep(delay)  # a tool's wait
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}], max_tokens=4,
                                                 temperature=1.0)
        return r.choices[0].message.content

    return agent


@art.reward
def first_token(t: art.Trajectory) -> float:
    if t.scenario["q"] == "huge":
        return 1e308  # not a reward the trainer takes: the step is refused, nothing moves
    return float(t.calls[0].choices[0].token_ids[0] % 5)


def scenarios(n):
    return [f"question {i}" for i in range(n)]


async def backend(tmp_path, name, **train):
    be = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / name))
    return be, art.TrainableModel("m", base_model="tiny", project="loop", config={"train": {"seed": 3, **train}})


def adapter(be):
    return torch.cat([p.detach().flatten() for n, p in be.models["m"].model.named_parameters() if ".policy." in n])


async def test_lag_zero_is_the_sequential_loop_step_for_step(tmp_path, art_store):
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    agent = make_agent(client)
    out = {}
    for how in ("sequential", "loop"):
        be, model = await backend(tmp_path, how)
        async with art.session(model, backend=be) as run:
            qs = scenarios(9)
            if how == "sequential":
                results = []
                for k in range(3):
                    groups = await art.gather(agent, qs[3 * k:3 * k + 3], group_size=3, rewards=[first_token])
                    results.append(await run.train(groups))
            else:
                results = [r async for r in run.loop(agent, qs, group_size=3, rewards=[first_token], steps=3,
                                                     scenarios_per_step=3, max_policy_lag=0)]
            sampled = [[c.choices[0].token_ids for c in t.calls]
                       for t in sorted(art_store.trajectories(run=run.run_id), key=lambda t: (t.step, t.scenario["q"],
                                                                                              t.group_index))]
            out[how] = (results, sampled, adapter(be))
        await be.close()
    seq, lp = out["sequential"], out["loop"]
    assert seq[1] == lp[1]  # the same tokens sampled, step for step (the same seeds)
    for a, b in zip(seq[0], lp[0]):
        assert (a.step, a.metrics["tokens_trained"]) == (b.step, b.metrics["tokens_trained"])
        assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], rel=1e-4, abs=1e-6)  # batching's float noise
    assert torch.allclose(seq[2], lp[2], atol=1e-6)
    await client.close()


@pytest.mark.parametrize("slow", ["trainer", "agent"])
async def test_the_lag_bound_holds_against_a_slow_trainer_and_a_slow_agent(tmp_path, art_store, slow):
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    agent = make_agent(client, delay=0.5 if slow == "agent" else 0.0)
    be, model = await backend(tmp_path, slow, **({"epochs": 40} if slow == "trainer" else {}))
    async with art.session(model, backend=be) as run:
        results = [r async for r in run.loop(agent, scenarios(16), group_size=2, rewards=[first_token], steps=5,
                                             scenarios_per_step=3, max_policy_lag=1)]
    await be.close()
    await client.close()
    assert len(results) == 5 and all(r.trained for r in results)
    for r in results:  # every trained token at most one step old, by the trainer's count and by the loop's
        assert r.metrics["policy_lag_max"] <= 1 and r.metrics["tokens_over_lag"] == 0
        assert (r.step - 1) - r.metrics["loop/gathered_at_step"] <= 1
    recorded = art_store.steps("loop", "m")  # the loop's figures are the step's, in the store (and trackers)
    assert [s["metrics"]["loop/max_policy_lag"] for s in recorded] == [1.0] * 5
    if slow == "trainer":  # the next batch was gathered while a step trained: it was waiting when the step began
        assert max(r.metrics["loop/queue_depth"] for r in results[1:]) >= 1
        assert any(r.metrics["policy_lag_max"] == 1 for r in results)
    else:  # the trainer waited for the slow rollouts
        assert sum(r.metrics["loop/trainer_idle_s"] for r in results) > 1.0


async def test_a_failed_rollout_and_a_refused_step_do_not_stop_the_loop(tmp_path, art_store):
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    agent = make_agent(client)
    be, model = await backend(tmp_path, "fail")
    qs = ["question 0", "raise", "question 1", "huge", "question 2", "question 3", "question 4", "question 5",
          "question 6"]
    async with art.session(model, backend=be) as run:
        results = [r async for r in run.loop(agent, qs, group_size=2, rewards=[first_token], steps=3,
                                             scenarios_per_step=3, max_policy_lag=1)]
    await be.close()
    await client.close()
    assert [r.trained for r in results] == [True, False, True]
    assert "finite" in results[1].reason and results[1].step == results[0].step  # refused: nothing moved
    assert results[2].step == results[0].step + 1
    stored = art_store.trajectories(project="loop")
    assert len(stored) == 9 * 2 and sum(1 for t in stored if t.error is not None) == 2  # nothing lost


async def test_dynamic_sampling_fills_a_step_with_groups_that_have_signal(art_store):
    @art.rollout
    def agent(i: int) -> int:
        return i

    @art.reward
    def mixed(t: art.Trajectory) -> float:  # even scenarios: every member alike (no signal)
        return 0.0 if t.scenario["i"] % 2 == 0 else float(t.group_index)

    groups = await art.gather(agent, iter(range(100)), group_size=2, rewards=[mixed], signal_groups=3)
    assert [g.scenario for g in groups] == [1, 3, 5] and all(not g.no_signal for g in groups)
    assert (groups.drawn, groups.dropped) == (6, 3)  # 0..5 drawn, the even ones dropped
    capped = await art.gather(agent, iter([0, 2, 4, 6, 8, 1]), group_size=2, rewards=[mixed], signal_groups=2,
                              max_scenarios=4)
    assert [g.scenario for g in capped] == [0, 2, 4, 6] and all(g.no_signal for g in capped)  # none had signal
    assert (capped.drawn, capped.dropped) == (4, 0)
    assert art_store.count() == 2 * (6 + 4)  # every group stored, those dropped too
    with pytest.raises(art.RolloutError, match="max_scenarios"):
        await art.gather(agent, [1], signal_groups=3, max_scenarios=2)


async def test_a_step_where_no_group_has_signal_moves_nothing_and_the_loop_goes_on(tmp_path, art_store):
    @art.rollout
    def agent(i: int) -> int:
        return i

    @art.reward
    def tied(t: art.Trajectory) -> float:
        return 1.0

    be, model = await backend(tmp_path, "tied")
    async with art.session(model, backend=be) as run:
        results = [r async for r in run.loop(agent, iter(range(100)), group_size=2, rewards=[tied], steps=2,
                                             scenarios_per_step=2, signal_groups=2, max_scenarios=3)]
        alone = await run.train(await art.gather(agent, iter(range(9)), group_size=2, rewards=[tied],
                                                 signal_groups=1, max_scenarios=2))
    await be.close()
    assert [(r.trained, r.step) for r in results + [alone]] == [(False, 0)] * 3
    assert all("equal rewards" in r.reason for r in results + [alone])
    assert [r.metrics["loop/scenarios_drawn"] for r in results] == [3, 3]
    assert art_store.count(project="loop") == 2 * (3 + 3 + 2)


async def test_requests_are_answered_between_a_steps_rows_and_the_step_is_unchanged(tmp_path, art_store):
    """A generation batch that waits while a step trains runs between the step's rows (the
    engine lends it the model), answered by the adapter it asked for; the step trains exactly
    what it trains alone."""
    import time

    from backends.local.engine import Request
    from tests.test_trust_region import batch

    weights, answered = [], []
    for busy in (False, True):
        be, model = await backend(tmp_path, f"lend{busy}", epochs=60)
        await be.register(model)
        served = be.models["m"]
        groups = batch(served, groups=2, size=4)
        prompt = served.chat.prompt_ids([{"role": "user", "content": "hi"}])
        step = asyncio.ensure_future(be.train(model, groups))
        if busy:
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            outs = [await asyncio.wrap_future(served.submit(Request(prompt=prompt, max_tokens=4, temperature=0)))
                    for _ in range(3)]
            answered = [time.monotonic() - t0, step.done()]
            assert all(o[0].token_ids for o in outs)
        result = await step
        assert result.trained and result.step == 1
        weights.append(adapter(be))
        await be.close()
    assert answered[1] is False  # the three answers came while the step was still training
    assert torch.equal(weights[0], weights[1])  # and the step is what it is without them


async def three_steps(be) -> list:
    """``run.loop`` for three steps of three scenarios x 2 with lag 1 on ``be`` (closed after), its
    results checked: every step trained, none past the lag bound."""
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    try:
        model = art.TrainableModel("m", base_model="tiny", project="loop", config={"train": {"epochs": 20}})
        async with art.session(model, backend=be) as run:
            results = [r async for r in run.loop(make_agent(client, delay=0.2), scenarios(12), group_size=2,
                                                 rewards=[first_token], steps=3, scenarios_per_step=3,
                                                 max_policy_lag=1)]
        await be.close()
    finally:
        await client.close()
    assert [r.step for r in results] == [1, 2, 3] and all(r.trained for r in results)
    assert all(r.metrics["policy_lag_max"] <= 1 and (r.step - 1) - r.metrics["loop/gathered_at_step"] <= 1
               for r in results)
    return results


async def test_the_loop_runs_the_same_on_the_remote_backend(tmp_path, art_store):
    from backends.remote import RemoteBackend
    from tests.serve_process import KEY, Serve, free_port

    srv = Serve(tmp_path, free_port()).start()
    try:
        await three_steps(RemoteBackend(srv.url, api_key=KEY))
    finally:
        srv.stop()


@on_ray
async def test_the_loop_runs_the_same_on_the_ray_backend(tmp_path, art_store):
    """One replica and one rank on their own cores: rollouts go on while the rank trains."""
    ray = pytest.importorskip("ray")
    from backends.ray import RayBackend
    from backends.ray.backend import RAY_SYSTEM_CONFIG

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _system_config=RAY_SYSTEM_CONFIG)
    try:
        results = await three_steps(RayBackend(device="cpu", dtype="float32", home=str(tmp_path / "ray"), replicas=1,
                                               trainers=1, health_interval_s=0.5))
    finally:
        ray.shutdown()
    assert any(r.metrics["loop/gathered_at_step"] < r.step - 1 for r in results)  # gathered while a step trained
