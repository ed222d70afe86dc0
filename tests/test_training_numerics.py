"""The GRPO step is right on the numbers users get: requests arriving during a step, bf16
serving, the old policy's logprobs, other models' calls, temperature and normalisation."""

import asyncio
import math
import threading

import pytest
import torch
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory
from tests.conftest import DEVICE, ENGINES

from backends.local import LocalBackend
from backends.local import served as served_module
from backends.local.engine import Request
from backends.local.trainer import LOSSES, TrainConfig, token_logprobs, train_step

pytestmark = pytest.mark.anyio
PROMPT = [{"role": "user", "content": "go"}]


def make_backend(tmp_path, dtype="float32", **kw):
    return LocalBackend(device=DEVICE, dtype=dtype, home=str(tmp_path / "home"), **kw)


async def tiny(tmp_path, name, **train):
    """A local backend serving the tiny model as ``name``: (backend, model, its ServedModel)."""
    be = make_backend(tmp_path)
    model = art.TrainableModel(name, base_model="tiny", config={"train": train} if train else {})
    await be.register(model)
    return be, model, be.models[name]


def traj(served, completions, reward, *, prompt=None, logprobs=None, model=None, params=None):
    """A trajectory of one call per completion (each a new conversation with the same prompt)."""
    prompt = prompt if prompt is not None else served.chat.prompt_ids(PROMPT)
    t = trajectory(calls=[[*PROMPT, {"role": "assistant", "content": "x"}] for _ in completions],
                   model=model or served.spec.name)
    for call, ids in zip(t.calls, completions):
        call.prompt_token_ids = list(prompt)
        call.choices[0].token_ids = list(ids)
        call.choices[0].logprobs = list(logprobs) if logprobs is not None else [-3.0] * len(ids)
        call.params = dict(params or {})
        if model is not None:
            call.served_by = model
    t.reward = reward
    return t


class Grab(torch.optim.Optimizer):
    """An optimizer that records the gradient it is given and moves nothing."""

    def __init__(self, params):
        super().__init__(list(params), {})
        self.grad = None

    def step(self, closure=None):
        self.grad = torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]])


def gradient(served, groups, **cfg):
    """The policy gradient of one step on ``groups`` and its metrics, with no weight moved."""
    with served.engine.lock:
        if served.merger is not None:
            served.merger.restore()
        served.model.set_adapter("policy")
        grab = Grab(p for n, p in served.model.named_parameters() if ".policy." in n)
        metrics = train_step(served.model, grab, groups, TrainConfig(**{"max_grad_norm": 1e9, "minibatches": 1, **cfg}),
                             served.tokenizing(), served.device)
    return grab.grad, metrics


# -- 1. a request that arrives during a training step -----------------------------------

@pytest.mark.parametrize("engine", ENGINES)
async def test_request_arriving_during_a_step_keeps_its_adapter(tmp_path, monkeypatch, engine):
    be = make_backend(tmp_path, engine=engine)
    model = art.TrainableModel("busy", base_model="tiny")
    endpoint = await be.register(model)
    served = be.models["busy"]
    groups = [art.Group(trajectories=[traj(served, [[10, 11]], 1.0), traj(served, [[12, 13]], 0.0)])]
    await be.train(model, groups)  # step 1 is now the newest

    started, release = threading.Event(), threading.Event()
    real = served_module.train_step

    def slow_step(*a, **kw):  # the step holds the model until the test lets it go
        started.set()
        assert release.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(served_module, "train_step", slow_step)
    go = threading.Event()
    if engine == "builtin":
        # the requests start generating only once the step is over -- published, and the old
        # one let go if nothing held it -- so they are still in flight when step 1 could be retired
        generate = served.engine._generate_isolated
        monkeypatch.setattr(served.engine, "_generate_isolated", lambda reqs, step: (go.wait(30), generate(reqs, step)))
    else:
        go.set()
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    training = asyncio.create_task(be.train(model, groups))
    await asyncio.to_thread(started.wait, 30)
    asking = [asyncio.create_task(client.chat.completions.create(model="busy", messages=PROMPT, max_tokens=4))
              for _ in range(8)]
    for _ in range(200):  # the requests have reached the engine (the built-in one waits for the step)
        if served.pins.get(1) or all(a.done() for a in asking):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    release.set()
    result = await training
    if engine == "builtin":  # held by the requests (vLLM, answering while the step trains, may be done already)
        assert served.pins.get(1) == 8 and 1 in served.serving  # still served
    go.set()
    answers = await asyncio.gather(*asking)  # failed with KeyError: 1 when step 1's adapter was retired under them
    assert result.step == 2
    assert {a.model for a in answers} == {"busy@1"}  # pinned when they arrived, answered by that adapter
    assert served.pins == {} and served.serving == {0, 2}  # then step 1 was let go
    after = await client.chat.completions.create(model="busy", messages=PROMPT, max_tokens=4)
    assert after.model == "busy@2"
    if engine == "vllm":  # and unloaded from vLLM, the new one loaded
        for _ in range(100):
            if served.engine.loaded() == {"busy", "busy@2"}:
                break
            await asyncio.sleep(0.05)
        assert served.engine.loaded() == {"busy", "busy@2"}
    await client.close()
    await be.close()


# -- 2. bf16 serving keeps the update ---------------------------------------------------

async def test_bf16_serving_keeps_the_update(tmp_path):
    """Merging a small update into bf16 weights rounded most of it away."""
    be = make_backend(tmp_path, dtype="bfloat16")
    model = art.TrainableModel("b", base_model="tiny", config={"train": {"learning_rate": 1e-4}})
    await be.register(model)
    served = be.models["b"]
    groups = [art.Group(trajectories=[traj(served, [[10, 11, 12]], 1.0), traj(served, [[20, 21, 22]], 0.0)])]
    for _ in range(2):
        await be.train(model, groups)
    ids = torch.tensor(served.chat.prompt_ids(PROMPT) + [10, 11, 12, 20, 21, 22], device=served.device)
    pos = torch.arange(len(ids), device=served.device)
    with torch.no_grad(), served.engine.lock:
        with served.engine.serving(served.step):
            served_lp = token_logprobs(served.model, ids, pos)
        if served.merger is not None:
            served.merger.restore()
        served.model.set_adapter("policy")
        trained_lp = token_logprobs(served.model, ids, pos)
        with served.model.disable_adapter():
            base_lp = token_logprobs(served.model, ids, pos)
    effect = (trained_lp - base_lp).abs().mean()
    assert effect > 1e-3  # the update is there to be kept
    assert (served_lp - trained_lp).abs().mean() < 0.05 * effect  # was 0.9x the effect, merged in bf16
    await be.close()


# -- 3. the old policy is the trainer's -------------------------------------------------

@pytest.mark.parametrize("loss", sorted(LOSSES))
async def test_ratio_is_one_and_the_sampler_gap_is_corrected(tmp_path, loss):
    """Recorded logprobs far from the trainer's (-6 for every token) used to be the ratio's
    denominator: most tokens were clipped before any update. Now the ratio is the trainer's own
    (exactly 1), the gap is a truncated importance weight, and it is reported."""
    be, model, served = await tiny(tmp_path, "o", loss=loss, minibatches=1)  # the first update: ratio 1
    groups = [art.Group(trajectories=[traj(served, [[10, 11, 12, 13]], r, logprobs=[-6.0] * 4)
                                      for r in (1.0, 0.0, 0.3)])]
    m = (await be.train(model, groups)).metrics
    assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # the tiny model gives these tokens about 1/512 each: log p ~ -6.2, so the gap is small but there
    assert 0 < m["logprob_mismatch"] < 2 and m["logprob_mismatch_max"] >= m["logprob_mismatch"]
    assert 0 < m["is_weight_mean"] <= 2.0 and 0 <= m["is_truncated"] <= 1
    await be.close()


async def test_importance_weight_is_truncated_at_the_cap(tmp_path):
    be, model, served = await tiny(tmp_path, "c")
    unlikely = [traj(served, [[10, 11, 12]], r, logprobs=[-30.0] * 3) for r in (1.0, 0.0)]
    capped, m = gradient(served, [art.Group(trajectories=unlikely)], is_cap=2.0)
    assert m["is_truncated"] == 1.0 and m["is_weight_mean"] == pytest.approx(2.0)
    assert m["logprob_mismatch"] > 20
    plain, m = gradient(served, [art.Group(trajectories=unlikely)], is_cap=None)
    assert m["is_weight_mean"] == 1.0 and torch.allclose(capped, 2 * plain, rtol=1e-5, atol=1e-9)
    await be.close()


# -- 4. calls other models answered are context -----------------------------------------

async def test_calls_to_other_models_are_not_trained(tmp_path):
    be, model, served = await tiny(tmp_path, "me")
    trajs = []
    for r in (1.0, 0.0):
        t = traj(served, [[10, 11, 12]], r)
        judge = t.calls[0].model_copy(deep=True)  # a gpt-4o-mini call inside the rollout
        judge.model, judge.served_by, judge.prompt_token_ids = "gpt-4o-mini", "gpt-4o-mini-2024-07-18", None
        judge.choices[0].token_ids = judge.choices[0].logprobs = None
        judge.choices[0].message = {"role": "assistant", "content": "a long answer from the judge model"}
        t.calls.insert(0, judge)
        trajs.append(t)
    m = (await be.train(model, [art.Group(trajectories=trajs)])).metrics
    assert m["tokens_trained"] == 2 * 3  # only the policy's own sampled tokens
    assert m["calls_other_model"] == 2
    await be.close()


# -- 5. temperature ---------------------------------------------------------------------

async def test_tempered_logprobs_are_recorded_and_trained(tmp_path):
    be, model, served = await tiny(tmp_path, "t")
    prompt = served.chat.prompt_ids(PROMPT)
    out = served.submit(Request(prompt=prompt, max_tokens=8, temperature=0.5, seed=1)).result(60)[0]
    ids = torch.tensor(prompt + out.token_ids, device=served.device)
    keep = torch.arange(len(prompt) - 1, len(ids) - 1, device=served.device)
    with torch.no_grad():
        logits = served.model(input_ids=ids[None]).logits[0, keep].float()
    tempered = torch.log_softmax(logits / 0.5, -1).gather(-1, ids[keep + 1][:, None])[:, 0].cpu()
    assert torch.allclose(torch.tensor(out.logprobs), tempered, atol=1e-4)  # was the T=1 logprob
    # the trainer scores the same tokens at the temperature the call was made with
    trajs = [traj(served, [out.token_ids], r, logprobs=out.logprobs, params={"temperature": 0.5})
             for r in (1.0, 0.0)]
    _, m = gradient(served, [art.Group(trajectories=trajs)])
    assert m["logprob_mismatch"] < 1e-4
    await be.close()


# -- 6 and 7. normalisation -------------------------------------------------------------

@pytest.mark.parametrize("loss", sorted(LOSSES))
async def test_gradient_is_the_mean_over_all_scored_trajectories(tmp_path, loss):
    """The gradient of two groups together is the weighted mean of each one's: a
    zero-advantage trajectory counts, and dr_grpo's normaliser does not depend on the batch."""
    be, model, served = await tiny(tmp_path, "n")
    g1 = art.Group(trajectories=[traj(served, [[10, 11]], 1.0), traj(served, [[12, 13, 14]], 0.0),
                                 traj(served, [[15, 16, 17, 18]], 0.5)])  # the last has advantage 0
    g2 = art.Group(trajectories=[traj(served, [[20, 21, 22, 23, 24, 25]], 1.0),
                                 traj(served, [[26, 27, 28, 29, 30, 31, 32]], 0.0)])
    both, _ = gradient(served, [g1, g2], loss=loss)
    one, _ = gradient(served, [g1], loss=loss)
    two, _ = gradient(served, [g2], loss=loss)
    if LOSSES[loss][2] == "token":
        c1, c2 = 9 / 22, 13 / 22  # shares of the trained tokens
    else:
        c1, c2 = 3 / 5, 2 / 5  # shares of the trajectories
    assert torch.allclose(both, c1 * one + c2 * two, rtol=1e-4, atol=1e-8)
    await be.close()


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
async def test_a_trajectory_split_in_segments_weighs_what_it_would_in_one(tmp_path, loss):
    be, model, served = await tiny(tmp_path, "s")
    whole = [traj(served, [[10, 11, 12]], 1.0), traj(served, [[20, 21]], 0.0)]
    # the same answer twice, in two calls whose prompts do not extend each other: two segments
    split = [traj(served, [[10, 11, 12], [10, 11, 12]], 1.0), traj(served, [[20, 21]], 0.0)]
    a, _ = gradient(served, [art.Group(trajectories=whole)], loss=loss)
    b, m = gradient(served, [art.Group(trajectories=split)], loss=loss)
    assert m["sequences"] == 3
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-8)  # was 2/3 : 1/3 instead of 1/2 : 1/2
    await be.close()


# -- the whole loop in bf16 -------------------------------------------------------------

async def test_bf16_loop_ratio_one_clip_zero_and_served_equals_trained(tmp_path, art_store, record_property):
    be = make_backend(tmp_path, dtype="bfloat16")
    model = art.TrainableModel("bf", base_model="tiny", config={"train": {"learning_rate": 3e-3}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    async with art.session(model, backend=be) as run:
        served = be.models["bf"]

        @art.rollout
        async def say(i: int) -> list[int]:
            r = await client.chat.completions.create(model="bf", messages=[{"role": "user", "content": f"say {i}"}],
                                                     max_tokens=8, temperature=1.0)
            return r.choices[0].model_extra["token_ids"]

        @art.reward
        def low_ids(t: art.Trajectory) -> float:
            return -sum(t.outcome) / len(t.outcome) / 500

        def check(groups):
            figures = {}
            for loss in sorted(LOSSES):
                _, m = gradient(served, groups, loss=loss)
                assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-6), loss
                figures[loss] = m["logprob_mismatch"]
            return max(figures.values())

        groups = await art.gather(say, range(4), group_size=4, rewards=[low_ids])
        assert {t.calls[0].served_by for g in groups for t in g} == {"bf@0"}
        at_step_0 = check(groups)
        for _ in range(2):
            await run.train(groups)
        groups = await art.gather(say, range(4), group_size=4, rewards=[low_ids])
        assert {t.calls[0].served_by for g in groups for t in g} == {"bf@2"}
        at_step_2 = check(groups)
        # the adapter moved the model well past bf16 noise, and what was served is what is trained
        t = groups[0][0]
        ids = torch.tensor(t.calls[0].prompt_token_ids + t.calls[0].choices[0].token_ids, device=served.device)
        keep = torch.arange(len(t.calls[0].prompt_token_ids) - 1, len(ids) - 1, device=served.device)
        pos = torch.arange(len(ids), device=served.device)
        with torch.no_grad(), served.engine.lock:
            if served.merger is not None:
                served.merger.restore()
            served.model.set_adapter("policy")
            with served.model.disable_adapter():
                base = token_logprobs(served.model, ids, pos, keep)
            trained = token_logprobs(served.model, ids, pos, keep)
        effect = float((trained - base).abs().mean())
    await client.close()
    for name, value in (("device", DEVICE), ("mismatch_step_0", at_step_0), ("mismatch_step_2", at_step_2),
                        ("adapter_effect", effect)):
        record_property(name, value)  # the figures, in the junit report of a GPU check
    assert at_step_0 < 0.05 and at_step_2 < 0.05, (at_step_0, at_step_2)  # bf16 kernels, batch shapes
    assert effect > 4 * at_step_2, (effect, at_step_2)
    assert math.isfinite(effect)


# -- a Responses call that continues an earlier response ---------------------------------

async def test_previous_response_id_is_resolved_or_refused_never_truncated(tmp_path):
    from backends.local.batch import segments

    be = make_backend(tmp_path)
    await be.register(art.TrainableModel("p", base_model="tiny"))
    served = be.models["p"]
    first = art.LLMCall(index=0, provider="openai-responses", model="p", served_by="p@0",
                        messages=[{"role": "user", "content": "one"}],
                        choices=[art.Choice(message={"role": "assistant", "content": "two", "id": "resp_1"},
                                            token_ids=[10, 11], logprobs=[-1.0, -1.0])])
    second = art.LLMCall(index=1, provider="openai-responses", model="p", served_by="p@0",
                         messages=[{"role": "user", "content": "three"}], params={"previous_response_id": "resp_1"},
                         choices=[art.Choice(message={"role": "assistant", "content": "four", "id": "resp_2"},
                                             token_ids=[12], logprobs=[-1.0])])
    t = art.Trajectory(calls=[first, second], reward=1.0)
    segs = segments(t, 1.0, served.tokenizing()).segments
    whole = served.chat.prompt_ids([{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
                                    {"role": "user", "content": "three"}])
    assert segs[-1].tokens[:len(whole)] == whole  # the whole conversation, not "three" alone
    orphan = art.Trajectory(calls=[second], reward=1.0)
    with pytest.raises(art.TrajectoryError, match="continues response 'resp_1'"):
        segments(orphan, 1.0, served.tokenizing())
    await be.close()
