"""What a review of the trainer found, each with a test that failed on the old code and needs
no TRL: the choice the agent went on with found by its tool call's arguments (or its tokens),
the old policy fixed across epochs, the KL term's direction, CISPO's clip fraction counted
for either sign of advantage, DAPO / CISPO normalised by the step's tokens per mini-batch,
and the sampled logprob recorded after top-p on both engines."""

import json
import math

import pytest
import torch

import artsdk as art
from artsdk.testing import trajectory
from backends.local.batch import minibatches, segments
from backends.local.engine import Request
from backends.local.trainer import TrainConfig, train_step
from tests.conftest import DEVICE, ENGINES
from tests.test_trust_region import PROMPT, Grab, adapter, answer, completion_logprobs, tiny

pytestmark = pytest.mark.anyio


def calling(args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{args['q']}", "type": "function", "function": {"name": "search", "arguments": json.dumps(args)}}]}


async def test_the_continued_choice_is_found_by_its_arguments_and_by_its_tokens(tmp_path):
    be, model, served = await tiny(tmp_path, "n2")
    p1 = served.chat.prompt_ids(PROMPT)
    tk = served.tokenizing()
    tk.policy = "test"
    for by_tokens in (False, True):
        went_on = calling({"q": "b"})
        # the agent re-serialised the arguments its own way: compared by what they say
        went_on["tool_calls"][0]["function"]["arguments"] = '{ "q" : "b" }'
        t = trajectory([*PROMPT, went_on, {"role": "tool", "tool_call_id": "cb", "content": "found"},
                        {"role": "assistant", "content": "end"}])
        first, second = t.calls
        first.prompt_token_ids = p1
        # two choices calling the same tool, with different arguments; the agent went on with the second
        first.choices = [art.Choice(index=i, message=calling({"q": q}), token_ids=ids, logprobs=[-1.0] * 2)
                         for i, (q, ids) in enumerate((("a", [10, 11]), ("b", [20, 21])))]
        second.prompt_token_ids = p1 + [20, 21, 5, 6] if by_tokens else [3] + p1  # tokens that carry choice 1, or not
        if by_tokens:
            second.messages[len(first.messages)] = {"role": "assistant", "content": "rendered differently"}
        second.choices[0].token_ids, second.choices[0].logprobs = [30], [-1.0]
        trained = [tok for s in segments(t, 1.0, tk).segments for tok, on in zip(s.tokens, s.trained) if on]
        assert trained[:2] == [20, 21], by_tokens  # choice 0 ([10, 11]) was trained: same tool name, same content
    await be.close()


async def test_the_old_policy_stays_the_steps_first_weights_for_every_epoch(tmp_path):
    """One mini-batch, three epochs: at update u the ratio is p_{W(u-1)} / p_{W0}, computed here
    from the weights each update started from. Recomputing the old logprobs at each epoch made
    every ratio 1."""
    be, model, served = await tiny(tmp_path, "old")
    groups = [art.Group(trajectories=[answer(served, [40 + 3 * k + j for j in range(5)], float(k % 3)) for k in range(4)])]

    class Record(torch.optim.SGD):
        def __init__(self, params):
            super().__init__(list(params), lr=5.0)
            self.seen = []

        def step(self, closure=None):
            self.seen.append([p.detach().clone() for g in self.param_groups for p in g["params"]])
            return super().step(closure)

    params = [p for n, p in served.model.named_parameters() if ".policy." in n]
    opt = Record(params)
    with served.engine.lock:
        served.engine.merger.restore()
        served.model.set_adapter("policy")
        m = train_step(served.model, opt, groups, TrainConfig(loss="grpo", minibatches=1, epochs=3, max_grad_norm=1e9,
                                                              epsilon=1e9, epsilon_high=1e9), served.tokenizing(), served.device)
        prompt = served.chat.prompt_ids(PROMPT)

        def logprobs() -> torch.Tensor:
            with torch.no_grad():
                return torch.cat([completion_logprobs(served, prompt, t.calls[0].choices[0].token_ids)
                                  for t in groups[0]])

        at = []
        for weights in opt.seen:
            with torch.no_grad():
                for p, w in zip(params, weights):
                    p.copy_(w)
            at.append(logprobs())
    for u in (2, 3):
        expected = float(torch.exp(at[u - 1] - at[0]).mean())
        assert abs(expected - 1) > 1e-3  # the weights moved: a fixed old policy gives a ratio off 1
        assert m[f"update/{u}/ratio_mean"] == pytest.approx(expected, rel=1e-4), u
    await be.close()


async def test_the_kl_term_pulls_towards_the_base_model_by_the_reverse_kl_gradient(tmp_path):
    """Rewards all equal: only the KL term trains. Its first gradient is, written out here,
    beta * sum_t c_t (log p_t - log p_base,t) grad log p_t (k3 times the ratio, at ratio 1),
    which moves log p towards the base model's: a flipped sign or a swapped estimator differs."""
    be, model, served = await tiny(tmp_path, "kl")
    with torch.no_grad():  # move the adapter off the base model
        for n, p in served.model.named_parameters():
            if ".policy." in n and "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    seqs = [[60 + 3 * i + j for j in range(n)] for i, n in enumerate((2, 5, 3))]
    groups = [art.Group(trajectories=[answer(served, s, 1.0) for s in seqs])]
    prompt = served.chat.prompt_ids(PROMPT)
    params = [p for n, p in served.model.named_parameters() if ".policy." in n]
    grab = Grab(params)
    beta, total = 0.5, sum(len(s) for s in seqs)
    with served.engine.lock:
        served.engine.merger.restore()
        served.model.set_adapter("policy")
        m = train_step(served.model, grab, groups, TrainConfig(loss="dapo", beta=beta, minibatches=1, max_grad_norm=1e9),
                       served.tokenizing(), served.device, reference=served.model.disable_adapter)
        assert m["kl"] > 0
        served.model.zero_grad()
        expected_loss = 0.0
        for s in seqs:
            with torch.no_grad(), served.model.disable_adapter():
                base = completion_logprobs(served, prompt, s)
            lp = completion_logprobs(served, prompt, s)
            expected_loss = expected_loss + (beta / total * (lp.detach() - base) * lp).sum()
        expected_loss.backward()
    expected = torch.cat([p.grad.flatten() for p in params])
    assert float(expected.abs().max()) > 0
    assert torch.allclose(grab.grad, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    await be.close()


async def test_cispo_counts_a_clipped_weight_whatever_the_advantage_sign(tmp_path):
    """A clip range of width zero: from the second update every token's weight is clipped (its
    ratio moved), those with a negative advantage too. Only the positive ones were counted."""
    be, model, served = await tiny(tmp_path, "cispo", loss="cispo", learning_rate=5e-2, minibatches=1, epochs=2,
                                   epsilon=0.0, epsilon_high=0.0)
    groups = [art.Group(trajectories=[answer(served, [40 + 3 * k + j for j in range(4)], float(k)) for k in range(4)])]
    m = (await be.train(model, groups)).metrics
    assert m["update/1/clip_fraction"] == 0.0 and m["update/2/clip_fraction"] == 1.0
    await be.close()


async def test_token_normalisation_divides_by_the_steps_tokens_per_minibatch(tmp_path):
    """DAPO with two mini-batches of different token counts: the first update's gradient is
    -sum over its tokens of A_i w grad log p / (the step's tokens / 2), as TRL divides; each
    mini-batch's own count weighed a token of the smaller one more."""
    be, model, served = await tiny(tmp_path, "norm")
    lengths, rewards = (2, 7, 3, 6), (1.0, 0.0, 0.25, 0.6)
    seqs = [[60 + 3 * i + j for j in range(n)] for i, n in enumerate(lengths)]
    prompt = served.chat.prompt_ids(PROMPT)
    with torch.no_grad():
        own = [completion_logprobs(served, prompt, s) for s in seqs]
    trajs = [answer(served, s, r, logprobs=lp.tolist()) for s, r, lp in zip(seqs, rewards, own)]
    params = [p for n, p in served.model.named_parameters() if ".policy." in n]
    grab = Grab(params)
    cfg = TrainConfig(loss="dapo", minibatches=2, max_grad_norm=1e9)
    first = minibatches(4, 2, cfg.seed + served.step)[0]
    assert len({sum(lengths[i] for i in mb) for mb in minibatches(4, 2, cfg.seed)}) == 2
    with served.engine.lock:
        served.engine.merger.restore()
        served.model.set_adapter("policy")

        class First(Grab):  # the first update's gradient only
            def step(self, closure=None):
                if self.grad is None:
                    super().step(closure)

        grab = First(params)
        train_step(served.model, grab, [art.Group(trajectories=trajs)], cfg, served.tokenizing(), served.device)
        mean = sum(rewards) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)
        share = sum(lengths) / 2
        served.model.zero_grad()
        ref = 0.0
        for i in first:
            s = seqs[i]
            lp = completion_logprobs(served, prompt, s)
            ref = ref - ((rewards[i] - mean) / (std + 1e-4) * lp).sum() / share
        ref.backward()
    expected = torch.cat([p.grad.flatten() for p in params])
    assert torch.allclose(grab.grad, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    await be.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_recorded_logprob_is_of_the_distribution_sampled_after_top_p(tmp_path, engine):
    """top_p = 0.6 at temperature 1: each recorded logprob is log p(token) - log(mass kept by
    top-p) of the full distribution, recomputed here by the trainer's own function: the same
    convention on both engines (the built-in one recorded log p before the cut)."""
    from backends.local import LocalBackend

    be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / "home"), engine=engine)
    await be.register(art.TrainableModel("p", base_model="tiny"))
    served = be.models["p"]
    prompt = served.chat.prompt_ids(PROMPT)
    (out,) = served.submit(Request(prompt=prompt, max_tokens=12, temperature=1.0, top_p=0.6, seed=3)).result(300)
    await be.close()
    ids = prompt + out.token_ids
    with torch.no_grad():
        logits = served.model(input_ids=torch.tensor([ids], device=served.device)).logits[0].float()
    cut = 0
    for k, (tok, recorded) in enumerate(zip(out.token_ids, out.logprobs)):
        full = torch.log_softmax(logits[len(prompt) - 1 + k], -1)
        p = full.exp()
        sorted_p, _ = p.sort(descending=True)
        kept = sorted_p[(sorted_p.cumsum(0) - sorted_p) <= 0.6].sum()
        expected = float(full[tok] - kept.log())
        cut += float(kept) < 0.999
        assert recorded == pytest.approx(expected, abs=2e-3), (k, recorded, expected, float(full[tok]))
    assert cut >= len(out.token_ids) // 2  # top-p did cut the distribution at most positions
