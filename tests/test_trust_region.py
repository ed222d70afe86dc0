"""Several optimizer steps per batch, so the trust region acts; bounded off-policy steps;
and the training defects a review found, each with the test that failed on the old code:
the advantage's std, the KL term, n > 1 choices, weight decay, a reused merged slot, a GPU
checkpoint resumed on the CPU, and each loss's gradient against a reference computed by hand."""

import copy
import math

import pytest
import torch

import artsdk as art
from artsdk.testing import trajectory
from backends.local import LocalBackend
from backends.local.batch import advantages, segments
from backends.local.trainer import TrainConfig, token_logprobs, train_step
from tests.conftest import DEVICE

pytestmark = pytest.mark.anyio
PROMPT = [{"role": "user", "content": "go"}]


async def tiny(tmp_path, name, **train):
    be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / name))
    model = art.TrainableModel(name, base_model="tiny", config={"train": train} if train else {})
    await be.register(model)
    return be, model, be.models[name]


def answer(served, ids, reward, logprobs=None):
    t = trajectory(calls=[[*PROMPT, {"role": "assistant", "content": "x"}]], model=served.spec.name)
    t.calls[0].prompt_token_ids = served.chat.prompt_ids(PROMPT)
    t.calls[0].choices[0].token_ids = list(ids)
    t.calls[0].choices[0].logprobs = list(logprobs) if logprobs is not None else [-6.0] * len(ids)
    t.reward = reward
    return t


def batch(served, groups=4, size=4, length=6):
    """``groups`` groups of ``size`` answers with distinct tokens and rewards."""
    out = []
    for g in range(groups):
        trajs = [answer(served, [40 + 7 * g + k + j for j in range(length)], float(k % 3) + 0.1 * g)
                 for k in range(size)]
        out.append(art.Group(trajectories=trajs))
    return out


def completion_logprobs(served, prompt, ids):
    """The trainer's logprobs of ``ids`` after ``prompt``, computed where the model is (a GPU check runs on CUDA)."""
    dev, n = served.device, len(prompt) + len(ids)
    return token_logprobs(served.model, torch.tensor(prompt + ids, device=dev), torch.arange(n, device=dev),
                          torch.arange(len(prompt) - 1, n - 1, device=dev))


def adapter(served):
    return torch.cat([p.detach().flatten().clone() for n, p in served.model.named_parameters() if ".policy." in n])


# -- the trust region acts ----------------------------------------------------------------

async def test_later_minibatches_are_clipped_and_the_clip_range_changes_what_is_trained(tmp_path):
    results = {}
    for eps in (1e-3, 0.2, 1e9):
        be, model, served = await tiny(tmp_path, f"tr{str(eps).replace('.', '')}", loss="grpo",
                                       learning_rate=2e-2, minibatches=4)
        m = (await be.train(model, batch(served), epsilon=eps, epsilon_high=eps)).metrics
        results[eps] = (m, adapter(served))
        await be.close()
    m, _ = results[1e-3]
    assert m["updates"] == 4
    # the old policy is the weights before the first update: its ratio is 1 and nothing is clipped there
    assert m["update/1/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["update/1/clip_fraction"] == 0.0
    later = [m[f"update/{i}/clip_fraction"] for i in (2, 3, 4)]
    assert max(later) > 0.2, later  # the ratio moved, and the squeezed range clipped it
    assert any(abs(m[f"update/{i}/ratio_mean"] - 1) > 1e-3 for i in (2, 3, 4))
    assert 0 < m["clip_fraction"] < 1
    # what is trained depends on the clip range (with one update per batch it could not)
    tight, usual, loose = (results[e][1] for e in (1e-3, 0.2, 1e9))
    assert (tight - usual).abs().max() > 1e-5 and (usual - loose).abs().max() > 1e-7
    assert results[1e9][0]["clip_fraction"] == 0.0


async def test_one_update_per_batch_ignores_the_clip_range(tmp_path):
    """With minibatches = epochs = 1 the ratio is exactly 1: any clip range gives the same step."""
    weights = []
    for eps in (1e-9, 0.2):
        be, model, served = await tiny(tmp_path, f"one{len(weights)}", loss="grpo", learning_rate=2e-2, minibatches=1)
        m = (await be.train(model, batch(served), epsilon=eps, epsilon_high=eps)).metrics
        assert m["updates"] == 1 and m["clip_fraction"] == 0.0 and m["ratio_mean"] == 1.0
        weights.append(adapter(served))
        await be.close()
    assert torch.equal(weights[0], weights[1])


async def test_epochs_pass_over_the_batch_again(tmp_path):
    be, model, served = await tiny(tmp_path, "ep", loss="dapo", learning_rate=1e-2, minibatches=2, epochs=3)
    m = (await be.train(model, batch(served))).metrics
    assert m["updates"] == 6 and m["tokens_trained"] == 4 * 4 * 6  # counted once, not per epoch
    assert abs(m["update/6/ratio_mean"] - 1) > abs(m["update/1/ratio_mean"] - 1)
    await be.close()


async def test_an_interrupted_step_with_several_updates_moves_nothing(tmp_path):
    import threading

    be, model, served = await tiny(tmp_path, "int", learning_rate=2e-2, minibatches=4)
    before = adapter(served)
    state = copy.deepcopy(served.optimizer.state_dict())
    stop, calls = threading.Event(), {"n": 0}
    real = served.optimizer.step

    def step_then_stop(*a, **kw):  # Ctrl-C arrives after the second of four updates
        calls["n"] += 1
        out = real(*a, **kw)
        if calls["n"] == 2:
            stop.set()
        return out

    served.optimizer.step = step_then_stop
    from backends.local.trainer import StepInterrupted

    with pytest.raises(StepInterrupted):
        served.train(batch(served), {}, stop)
    assert calls["n"] == 2 and torch.equal(adapter(served), before)  # the two updates were put back
    assert served.step == 0 and served.optimizer.state_dict()["state"].keys() == state["state"].keys()
    await be.close()


# -- bounded off-policy ------------------------------------------------------------------

async def test_tokens_older_than_max_policy_lag_are_context(tmp_path):
    be, model, served = await tiny(tmp_path, "lag", learning_rate=1e-3)
    await be.train(model, batch(served, groups=1))
    await be.train(model, batch(served, groups=1))
    assert served.step == 2
    old = batch(served, groups=2)
    for g, step in zip(old, (0, 2)):  # one group sampled at step 0, one at step 2
        for t in g:
            t.calls[0].served_by, t.calls[0].step = f"{served.spec.name}@{step}", step
    m = (await be.train(model, old, max_policy_lag=1)).metrics
    assert m["tokens_over_lag"] == 4 * 6 and m["tokens_trained"] == 4 * 6
    assert m["policy_lag_max"] == 0.0
    m = (await be.train(model, old)).metrics  # no bound: both trained, the lag reported
    assert m["tokens_over_lag"] == 0 and m["tokens_trained"] == 8 * 6
    assert m["policy_lag_max"] == 3.0 and m["policy_lag_mean"] == pytest.approx(2.0)  # now at step 3
    with pytest.raises(art.BackendError, match="max_policy_lag"):
        await be.train(model, old, max_policy_lag=-1)
    await be.close()


# -- defect 1: the std in the advantage ----------------------------------------------------

def test_a_tie_break_reward_is_not_a_full_advantage():
    def group(*rewards):
        return art.Group(trajectories=[art.Trajectory(reward=r) for r in rewards])

    tie = [x for _, x in advantages([group(0.0, 1e-5)], scale=True)[0]]
    assert max(abs(x) for x in tie) < 0.05  # was +-0.83 (std + 1e-6)
    full = [x for _, x in advantages([group(0.0, 1.0, 1.0, 0.0)], scale=True)[0]]
    std = math.sqrt(sum((r - 0.5) ** 2 for r in (0, 1, 1, 0)) / 3)  # Bessel's, as TRL
    assert full == pytest.approx([-0.5 / (std + 1e-4), 0.5 / (std + 1e-4), 0.5 / (std + 1e-4), -0.5 / (std + 1e-4)])


# -- defect 2: the KL term pulls every trajectory ------------------------------------------

async def test_kl_pulls_trajectories_without_signal(tmp_path):
    be, model, served = await tiny(tmp_path, "kl", learning_rate=2e-2)
    await be.train(model, batch(served))  # move away from the base model first
    same = [art.Group(trajectories=[answer(served, [50 + k, 51, 52], 1.0) for k in range(4)])]
    result = await be.train(model, same, beta=0.1)
    assert result.trained and result.metrics["kl"] > 0 and result.metrics["grad_norm"] > 0
    assert result.metrics["tokens_trained"] == 4 * 3
    result = await be.train(model, same)  # without a KL term there is nothing to learn from
    assert not result.trained
    await be.close()


# -- defect 3: n > 1 ---------------------------------------------------------------------

async def test_the_choice_the_agent_went_on_with_is_trained(tmp_path):
    be, model, served = await tiny(tmp_path, "n2")
    p1 = served.chat.prompt_ids(PROMPT)
    t = trajectory([*PROMPT, {"role": "assistant", "content": "second"}, {"role": "user", "content": "more"},
                    {"role": "assistant", "content": "end"}])
    first, second = t.calls
    first.prompt_token_ids = p1
    first.choices = [art.Choice(index=0, message={"role": "assistant", "content": "first"}, token_ids=[10, 11],
                                logprobs=[-1.0, -1.0]),
                     art.Choice(index=1, message={"role": "assistant", "content": "second"}, token_ids=[20, 21],
                                logprobs=[-1.0, -1.0])]
    second.prompt_token_ids = p1 + [20, 21, 5, 6]  # the conversation went on with choice 1
    second.choices[0].token_ids, second.choices[0].logprobs = [30], [-1.0]
    tk = served.tokenizing()
    tk.policy = "test"
    segs = segments(t, 1.0, tk).segments
    assert len(segs) == 1  # one conversation, continued
    trained = [tok for tok, on in zip(segs[0].tokens, segs[0].trained) if on]
    assert trained == [20, 21, 30]  # was [10, 11] and a second sequence
    await be.close()


# -- defect 4: weight decay ---------------------------------------------------------------

async def test_weight_decay_passed_to_train_is_used(tmp_path):
    norms = []
    for wd in (0.0, 20.0):
        be, model, served = await tiny(tmp_path, f"wd{int(wd)}", learning_rate=1e-2)
        await be.train(model, batch(served), weight_decay=wd)
        a = torch.cat([p.detach().flatten() for n, p in served.model.named_parameters()
                       if ".policy." in n and "lora_A" in n])
        norms.append(float(a.norm()))
        await be.close()
    # decoupled decay shrinks A by lr * wd = 20% in one step (it was ignored: equal norms)
    assert norms[1] < 0.9 * norms[0], norms


# -- defect 5: a freed slot reused while its old weights are merged ---------------------------

async def test_a_reused_slot_serves_the_new_weights_not_the_merged_old_ones(tmp_path):
    be, model, served = await tiny(tmp_path, "slot")
    engine = served.engine
    assert engine.merger is not None  # fp32 on the CPU: adapters are served merged
    ids = torch.tensor(served.chat.prompt_ids(PROMPT) + [10, 11, 12, 13], device=served.device)
    pos = torch.arange(len(ids), device=served.device)

    def set_policy(scale):
        with torch.no_grad():
            for n, p in served.model.named_parameters():
                if ".policy." in n and "lora_B" in n:
                    p.copy_(torch.full_like(p, scale))

    def served_logprobs(step):
        with torch.no_grad(), engine.lock, engine.serving(step):
            return token_logprobs(served.model, ids, pos)

    def policy_logprobs():
        with torch.no_grad(), engine.lock:
            engine.merger.restore()
            served.model.set_adapter("policy")
            return token_logprobs(served.model, ids, pos)

    set_policy(0.05)
    engine.publish(1)
    served_logprobs(1)  # step 1 merged in
    engine.retire(1)  # its slot is free...
    set_policy(-0.05)
    engine.publish(3)  # ...and reused for step 3
    assert (served_logprobs(3) - policy_logprobs()).abs().max() < 1e-4  # was step 1's weights
    await be.close()


# -- defect 7: a checkpoint written on a GPU resumes on a CPU machine -----------------------

async def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path):
    be, model, served = await tiny(tmp_path, "gpu", learning_rate=1e-2)
    await be.train(model, batch(served))
    trained = adapter(served)
    path = served.checkpoints.path(1) / "optimizer.pt"
    await be.close()
    # rewrite the optimizer state as a CUDA run writes it: every storage located on cuda:0
    import torch.serialization as ts

    state = torch.load(path, weights_only=False)
    entry = (0, lambda obj: "cuda:0" if obj.device.type == "cpu" else None, lambda obj, loc: None)
    ts._package_registry.insert(0, entry)
    try:
        torch.save(state, path)
    finally:
        ts._package_registry.remove(entry)
    if not torch.cuda.is_available():  # what resuming did before, on a machine without CUDA
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=False)
    be, model, served = await tiny(tmp_path, "gpu", learning_rate=1e-2)
    assert served.step == 1 and torch.equal(adapter(served), trained)
    await be.train(model, batch(served))  # and it trains on from there
    assert served.step == 2
    await be.close()


# -- defect 9: each loss's gradient against one computed by hand -----------------------------

NORMALISATION = {"grpo": "sequence", "dr_grpo": "constant", "dapo": "token", "gspo": "sequence", "cispo": "token"}


class Grab(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(list(params), {})
        self.grad = None

    def step(self, closure=None):
        self.grad = torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]])


@pytest.mark.parametrize("loss", sorted(NORMALISATION))
async def test_gradient_matches_a_reference_computed_by_hand(tmp_path, loss):
    """The first update's gradient is -sum_i sum_t c_it A_i w_it grad log p_it, with c the
    loss's normalisation (written out here, not read from the code under test), A the
    advantage (std + 1e-4, Bessel's; none for dr_grpo) and w the sampler weight, a constant
    (exp(mean gap) per trajectory for gspo), truncated at is_cap."""
    be, model, served = await tiny(tmp_path, f"ref{loss}")
    prompt = served.chat.prompt_ids(PROMPT)
    lengths, rewards = (2, 5, 3, 4), (1.0, 0.0, 0.25, 0.6)
    params = [p for n, p in served.model.named_parameters() if ".policy." in n]
    with torch.no_grad():  # give the adapter some weight so the gradient is not the base model's alone
        for n, p in served.model.named_parameters():
            if ".policy." in n and "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    seqs = [[60 + 3 * i + j for j in range(n)] for i, n in enumerate(lengths)]
    with served.engine.lock:
        served.engine.merger.restore()
        served.model.set_adapter("policy")
    offsets = [[0.3 * math.sin(i + 2 * j) for j in range(n)] for i, n in enumerate(lengths)]
    with torch.no_grad():
        own = [completion_logprobs(served, prompt, s) for s in seqs]
    # sampler logprobs a little off the trainer's: per-token weights between e^-0.3 and e^0.3
    trajs = [answer(served, s, r, logprobs=(lp - torch.tensor(o, device=lp.device)).tolist())
             for s, r, lp, o in zip(seqs, rewards, own, offsets)]
    grab = Grab(params)
    with served.engine.lock:
        train_step(served.model, grab, [art.Group(trajectories=trajs)],
                   TrainConfig(loss=loss, max_grad_norm=1e9, max_completion_tokens=50, minibatches=1), served.tokenizing(),
                   served.device)
    mean = sum(rewards) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)
    adv = [(r - mean) if loss == "dr_grpo" else (r - mean) / (std + 1e-4) for r in rewards]
    total = sum(lengths)
    served.model.zero_grad()
    ref = 0.0
    for s, a, o, n in zip(seqs, adv, offsets, lengths):
        lp = completion_logprobs(served, prompt, s)
        o = torch.tensor(o, device=lp.device)
        w = torch.exp(o) if loss != "gspo" else torch.exp(o.mean()).expand(n)
        c = {"token": 1 / total, "sequence": 1 / (4 * n), "constant": 1 / (4 * 50)}[NORMALISATION[loss]]
        ref = ref - (c * a * w.clamp(max=2.0) * lp).sum()
    ref.backward()
    expected = torch.cat([p.grad.flatten() for p in params])
    tolerance = 1e-4 * float(expected.abs().max())  # float noise of summation order, not a formula error
    assert torch.allclose(grab.grad, expected, rtol=1e-4, atol=tolerance), (grab.grad - expected).abs().max()
    await be.close()


async def test_dr_grpo_normalises_by_a_constant(tmp_path):
    be, model, served = await tiny(tmp_path, "dr")
    groups = batch(served, groups=2)
    grads = []
    for m in (100, 200):
        grab = Grab(p for n, p in served.model.named_parameters() if ".policy." in n)
        with served.engine.lock:
            served.engine.merger.restore()
            train_step(served.model, grab, groups, TrainConfig(loss="dr_grpo", max_grad_norm=1e9, minibatches=1,
                                                               max_completion_tokens=m),
                       served.tokenizing(), served.device)
        grads.append(grab.grad)
    assert torch.allclose(grads[0], 2 * grads[1], rtol=1e-5, atol=1e-9)  # per-sequence would not scale
    await be.close()


# -- defect 8: a GSPO trajectory longer than a row ------------------------------------------

async def test_gspo_ratio_and_weight_are_per_trajectory_across_rows(tmp_path):
    """A trajectory of two calls whose prompts do not extend each other is two segments; with
    a row budget smaller than both, they land in two rows. Its sequence ratio and sampler
    weight are still over all of its tokens: the step equals the one with one big row."""
    weights = []
    for whole in (True, False):
        be, model, served = await tiny(tmp_path, f"gs{whole}", loss="gspo", learning_rate=2e-2, minibatches=2,
                                       epsilon=0.5, epsilon_high=0.5)
        prompt = served.chat.prompt_ids(PROMPT)
        budget = 4096 if whole else len(prompt) + 10  # room for one of a trajectory's segments, not both
        groups = []
        for g in range(2):
            trajs = []
            for k in range(4):
                t = trajectory(calls=[[*PROMPT, {"role": "assistant", "content": "a"}],
                                      [{"role": "user", "content": "again"}, {"role": "assistant", "content": "b"}]],
                               model=served.spec.name)
                for n, call in enumerate(t.calls):
                    call.prompt_token_ids = prompt if n == 0 else [7] + prompt
                    call.choices[0].token_ids = [30 + 5 * g + k + j for j in range(8)]
                    # the sampler's logprobs far from the trainer's in one call only: per-row means differ
                    call.choices[0].logprobs = [-6.0 - (0.8 if n else 0.0)] * 8
                t.reward = float((k + g) % 3)
                trajs.append(t)
            groups.append(art.Group(trajectories=trajs))
        m = (await be.train(model, groups, tokens_per_row=budget)).metrics
        assert m["rows"] == (2 if whole else 12)  # a row per mini-batch, or a row per segment (6 trajectories have an advantage)
        weights.append(adapter(served))
        await be.close()
    # float noise between the two packings reaches 2e-5 on some machines; per-row ratios or weights
    # (the defect) move the adapter by 0.03-0.08
    assert torch.allclose(weights[0], weights[1], rtol=1e-4, atol=5e-4), (weights[0] - weights[1]).abs().max()
