"""GRPO on the local backend with the tiny model: it learns, packing is exact, every loss
runs, checkpoints are atomic and a resumed run matches an uninterrupted one."""

import math

import pytest
import torch
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory
from tests.conftest import DEVICE, ENGINES
from tests.learning import WORDS, learn_to_say

from backends.local import LocalBackend
from backends.local.batch import Segment, pack
from backends.local.trainer import LOSSES, token_logprobs

pytestmark = pytest.mark.anyio


def make_backend(tmp_path, **kw):
    return LocalBackend(device="cpu", home=str(tmp_path / "home"), **kw)


@pytest.mark.parametrize("engine", ENGINES)
async def test_full_loop_learns_to_answer_with_a_word(tmp_path, art_store, engine, record_property):
    """gather -> train -> hot-swap -> gather, until the model says the words, with either
    engine sampling (on ARTSDK_TEST_DEVICE: a GPU check runs it on CUDA)."""
    torch.manual_seed(0)
    be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / "home"), engine=engine)
    model = art.TrainableModel("toy", base_model="tiny", project="learn",
                               config={"train": {"learning_rate": 2e-2}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    async with art.session(model, backend=be) as run:
        tok = be.models["toy"].tokenizer
        words = tok.convert_ids_to_tokens(sorted(WORDS))

        @art.rollout
        async def answer(i: int) -> str:
            r = await client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": "Say the word."}], max_tokens=6)
            return r.choices[0].message.content

        def newest(calls, step):
            assert {c.served_by for c in calls} == {f"toy@{step}"}  # every call answered by the newest adapter

        curve = await learn_to_say(run, answer, newest)
    await be.close()
    await client.close()
    assert curve[0] < 0.1, curve
    assert max(curve) > 0.8, f"reward curve {curve} for words {words}"
    steps = art_store.steps("learn", "toy")
    assert len(steps) == len(curve) - 1 and "clip_fraction" in steps[0]["metrics"]
    record_property("device", DEVICE)  # the figures, in the junit report of a GPU check
    record_property("curve", [round(c, 3) for c in curve])
    record_property("logprob_mismatch", [s["metrics"]["logprob_mismatch"] for s in steps])
    # the sampler's logprobs are the trainer's (fp32): token-exact, whichever engine sampled
    assert all(s["metrics"]["logprob_mismatch"] < 1e-4 for s in steps), [s["metrics"]["logprob_mismatch"] for s in steps]
    # the trajectories trained on carried the exact sampled tokens
    t = art_store.trajectories(project="learn", limit=1)[0]
    assert t.calls[0].choices[0].trainable and t.calls[0].prompt_token_ids


async def test_packed_rows_match_separate_sequences(tmp_path):
    be = make_backend(tmp_path)
    await be.register(art.TrainableModel("p", base_model="tiny"))
    model = be.models["p"].model
    a, b = list(range(5, 25)), list(range(40, 52))
    with torch.no_grad():
        sep_a = token_logprobs(model, torch.tensor(a), torch.arange(len(a)))
        sep_b = token_logprobs(model, torch.tensor(b), torch.arange(len(b)))
        packed = token_logprobs(model, torch.tensor(a + b), torch.tensor(list(range(len(a))) + list(range(len(b)))))
    assert torch.allclose(packed[:len(a) - 1], sep_a, atol=1e-5)
    assert torch.allclose(packed[len(a):], sep_b, atol=1e-5)  # b's tokens never see a's
    rows = pack([[Segment(tokens=[0] * n)] for n in (900, 700, 500, 300, 100)], budget=1000)
    assert sorted(sum(len(s.tokens) for s in r) for r in rows) == [500, 1000, 1000]
    await be.close()


def _groups(served):
    prompt = served.chat.prompt_ids([{"role": "user", "content": "go"}])
    out = []
    for k in range(2):
        trajs = []
        for i, r in enumerate((1.0, 0.0, 0.5)):
            t = trajectory([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}],
                           token_ids=[10 + i, 20 + k, 30, served.chat.end_id], logprobs=[-6.0] * 4,
                           model=served.spec.name)
            t.calls[0].prompt_token_ids = prompt
            t.reward = r
            trajs.append(t)
        out.append(art.Group(trajectories=trajs))
    out.append(art.Group(trajectories=[t.model_copy(update={"reward": 1.0}) for t in trajs]))  # no signal
    return out


@pytest.mark.parametrize("loss", sorted(LOSSES))
async def test_every_loss_trains(tmp_path, loss):
    be = make_backend(tmp_path)
    model = art.TrainableModel("l", base_model="tiny", config={"train": {"loss": loss}})
    await be.register(model)
    served = be.models["l"]
    res = await be.train(model, _groups(served))
    m = res.metrics
    assert res.groups_skipped == 1 and res.groups_trained == 2
    # the reward-0.5 trajectory of each group has advantage 0: nothing to learn from it
    assert m["tokens_trained"] == 4 * 4 and m["sequences"] == 4
    assert m["grad_norm"] > 0 and math.isfinite(m["loss"]) and m["kl"] == 0
    prompt_len = len(served.chat.prompt_ids([{"role": "user", "content": "go"}]))
    assert 0 <= m["clip_fraction"] <= 1 and m["tokens_total"] == 4 * (prompt_len + 4)
    # with a KL term every trajectory is pulled toward the base model, advantage or not
    m = (await be.train(model, _groups(served), beta=0.05)).metrics
    assert m["tokens_trained"] == 9 * 4 and m["sequences"] == 9 and m["kl"] > 0
    await be.close()


async def test_multi_turn_extends_one_sequence_and_bad_settings(tmp_path):
    from backends.local.batch import segments

    be = make_backend(tmp_path)
    model = art.TrainableModel("m", base_model="tiny")
    await be.register(model)
    served = be.models["m"]
    p1 = served.chat.prompt_ids([{"role": "user", "content": "a"}])
    t = trajectory(calls=[[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                          [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]])
    t.calls[0].prompt_token_ids, t.calls[0].choices[0].token_ids = p1, [7, 8]
    t.calls[0].choices[0].logprobs = [-1.0, -1.0]
    t.calls[1].prompt_token_ids = p1 + [7, 8] + [3, 4]  # extends turn one: same sequence
    t.calls[1].choices[0].token_ids, t.calls[1].choices[0].logprobs = [9], [-1.0]
    tk = served.tokenizing()
    tk.policy = "test"  # the model hand-made calls name
    segs = segments(t, 1.0, tk).segments
    assert len(segs) == 1 and segs[0].tokens == p1 + [7, 8, 3, 4, 9]
    assert segs[0].trained == [False] * len(p1) + [True, True, False, False, True]
    t.calls[1].prompt_token_ids = [99] + p1  # does not extend: a second sequence
    assert len(segments(t, 1.0, tk).segments) == 2
    with pytest.raises(art.BackendError, match="unknown loss 'ppo'"):
        await be.train(model, [], loss="ppo")
    with pytest.raises(art.BackendError, match=r"unknown training setting\(s\) \['lr'\]"):
        await be.train(model, [], lr=1)
    await be.close()


async def test_resume_matches_an_uninterrupted_run_and_retention(tmp_path):
    def weights(be, name):
        return {k: v.detach().clone() for k, v in be.models[name].model.named_parameters() if ".policy." in k}

    model = art.TrainableModel("r", base_model="tiny", project="res")
    straight = make_backend(tmp_path / "a")
    await straight.register(model)
    groups = _groups(straight.models["r"])
    for _ in range(3):
        await straight.train(model, groups)
    expected = weights(straight, "r")
    await straight.close()

    first = make_backend(tmp_path / "b", keep_checkpoints=2)
    await first.register(model)
    await first.train(model, groups)
    await first.train(model, groups)
    await first.close()  # the run is "killed" after step 2
    ckpts = tmp_path / "b" / "home" / "res" / "r" / "checkpoints"
    (ckpts / "3.tmp999").mkdir()  # a half-written checkpoint left by a crash
    resumed = make_backend(tmp_path / "b", keep_checkpoints=2)
    await resumed.register(model)
    assert await resumed.step(model) == 2
    assert not (ckpts / "3.tmp999").exists()
    await resumed.train(model, groups)
    got = weights(resumed, "r")
    assert all(torch.allclose(got[k], expected[k], atol=1e-6) for k in expected)
    assert sorted(p.name for p in ckpts.iterdir()) == ["2", "3"]  # keep the newest 2
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "trainer_state.json"} <= {
        p.name for p in (ckpts / "3").iterdir()}
    await resumed.close()
    other = make_backend(tmp_path / "b")
    with pytest.raises(art.BackendError, match="trained from base model 'tiny', not '.*elsewhere'"):
        await other.register(art.TrainableModel("r", base_model=str(tmp_path / "elsewhere"), project="res"))
    await other.close()


async def test_in_flight_request_keeps_its_adapter(tmp_path):
    from backends.local.engine import Request

    be = make_backend(tmp_path)
    model = art.TrainableModel("f", base_model="tiny", config={"train": {"learning_rate": 0.5}})
    await be.register(model)
    served = be.models["f"]
    prompt = served.chat.prompt_ids([{"role": "user", "content": "hi"}])
    groups = _groups(served)

    def run(step):
        req = Request(prompt=prompt, max_tokens=6, temperature=0)
        return served.submit(req, step).result(60)[0].logprobs

    await be.train(model, groups)
    at_step_1 = run(1)
    assert served.pin() == 1  # a request still running on step 1
    await be.train(model, groups)
    assert served.step == 2 and 1 in served.serving
    assert run(1) == pytest.approx(at_step_1, abs=1e-5)  # it keeps the adapter it started with (the prefix
    # cache computes the prompt's start once: its logprobs match to float noise)
    assert run(2) != at_step_1  # new requests get the new one
    served.unpin(1)  # it finished: an old step no request pins is no longer served
    assert served.serving == {0, 2} and len(served.engine.free) == 1
    await be.train(model, groups)
    assert served.serving == {0, 3}
    assert len(served.engine.free) == 1 and len(served.model.peft_config) == 3  # policy + 2 serving
    await be.train(model, groups)
    assert served.serving == {0, 4} and len(served.model.peft_config) == 3  # a free one was reused
    await be.close()
