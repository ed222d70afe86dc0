"""TRL as the oracle: each loss's value and gradient, on the same batch and the same weights,
through TRL's own ``GRPOTrainer._compute_loss`` -- at the first update of a step (ratio 1)
and at a later mini-batch (the ratio moved, the clip range acts) -- against ours.

Where ours differs from TRL on purpose, the test says so: GSPO's sampler weight is the
geometric mean of the trajectory's token weights (TRL's sequence modes take their product),
so GSPO is compared without the sampler correction; TRL's cispo ``epsilon_high`` is the
ratio's upper bound itself, ours ``1 + epsilon_high``.
"""

import math

import pytest
import torch

import artsdk as art
from backends.local.batch import Tokenizing, minibatches
from backends.local.tiny import build_tiny
from backends.local.trainer import TrainConfig, train_step

trl = pytest.importorskip("trl")

P, C, B = 6, 5, 8  # prompt and completion lengths (equal for all: TRL would pad otherwise), batch size
# loss: (TRL GRPOConfig settings, our TrainConfig settings, with the sampler correction)
CASES = {
    "grpo": ({"loss_type": "grpo"}, {"loss": "grpo"}, True),
    "dr_grpo": ({"loss_type": "dr_grpo", "scale_rewards": "none"}, {"loss": "dr_grpo"}, True),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"loss": "dapo"}, True),
    "gspo": ({"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
             {"loss": "gspo"}, False),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 5.0}, {"loss": "cispo"}, True),
    "grpo+kl": ({"loss_type": "grpo", "beta": 0.1}, {"loss": "grpo", "beta": 0.1}, True),
}


class Record(torch.optim.SGD):
    """SGD that keeps, for each update, the weights it started from and the gradient."""

    def __init__(self, params, lr):
        super().__init__(list(params), lr=lr)
        self.seen = []

    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        self.seen.append(([p.detach().clone() for p in params], [p.grad.detach().clone() for p in params]))
        return super().step(closure)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_loss_matches_trl(tiny_folder, tmp_path, case):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    trl_args, ours, corrected = CASES[case]
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32)  # the KL's base model
    with torch.no_grad():  # move the trained model off the reference so the KL term is not zero
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    initial = [p.detach().clone() for p in model.parameters()]

    # the batch: two groups of four answers to one prompt, with sampler logprobs a little off
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, 400, (P,), generator=g).tolist()
    completions = torch.randint(10, 400, (B, C), generator=g)
    offsets = (torch.rand(B, C, generator=g) - 0.5) * 0.6
    rewards = [1.0, 0.0, 0.4, 0.7, 0.2, 0.9, 0.9, 0.1]
    with torch.no_grad():
        ids = torch.cat([torch.tensor([prompt] * B), completions], 1)
        logits = model(input_ids=ids).logits[:, P - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, completions[..., None])[..., 0]
    trajs = []
    for i in range(B):
        call = art.LLMCall(model="m", served_by="m@0", prompt_token_ids=prompt,
                           choices=[art.Choice(message={"role": "assistant", "content": "x"},
                                               token_ids=completions[i].tolist(),
                                               logprobs=(own[i] - offsets[i]).tolist())])
        trajs.append(art.Trajectory(calls=[call], reward=rewards[i]))
    groups = [art.Group(trajectories=trajs[:4]), art.Group(trajectories=trajs[4:])]

    # ours: two mini-batches, so the second update's ratio has moved
    cfg = TrainConfig(**ours, minibatches=2, max_grad_norm=1e9, max_completion_tokens=C,
                      is_cap=2.0 if corrected else None)
    opt = Record(model.parameters(), lr=3.0)
    tk = Tokenizing(policy="m", prompt_ids=None, completion_ids=None, vocab_size=model.config.vocab_size,
                    context_length=2048)

    class Base:  # the KL's reference: the untouched model's weights for the block
        def __call__(self):
            return self

        def __enter__(self):
            self.saved = [p.detach().clone() for p in model.parameters()]
            with torch.no_grad():
                for p, r in zip(model.parameters(), reference.parameters()):
                    p.copy_(r)

        def __exit__(self, *exc):
            with torch.no_grad():
                for p, s in zip(model.parameters(), self.saved):
                    p.copy_(s)

    metrics = train_step(model, opt, groups, cfg, tk, "cpu", reference=Base())
    assert metrics["updates"] == 2 and len(opt.seen) == 2
    if case in ("grpo", "dapo"):
        assert metrics["update/2/clip_fraction"] > 0  # the comparison covers clipped tokens

    # TRL: a real GRPOTrainer, its _compute_loss on each mini-batch at the weights that update started from
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to=[],
                        per_device_train_batch_size=4, num_generations=4, max_completion_length=C,
                        **{"beta": 0.0, **trl_args})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8), processing_class=tok)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = corrected, corrected
    trainer.current_gradient_accumulation_steps = 1
    model.train()
    members = minibatches(B, 2, cfg.seed)
    with torch.no_grad():
        for p, w in zip(model.parameters(), initial):
            p.copy_(w)
        old = torch.log_softmax(model(input_ids=ids).logits[:, P - 1:-1].float(), -1) \
            .gather(-1, completions[..., None])[..., 0]
        ref = torch.log_softmax(reference(input_ids=ids).logits[:, P - 1:-1].float(), -1) \
            .gather(-1, completions[..., None])[..., 0]
    r = torch.tensor(rewards).view(2, 4)
    adv = r - r.mean(1, keepdim=True)
    if case != "dr_grpo":
        adv = adv / (r.std(1, keepdim=True) + 1e-4)
    adv = adv.flatten()
    for update, mb in enumerate(members):
        weights, grads = opt.seen[update]
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(w)
        model.zero_grad()
        sel = torch.tensor(mb)
        inputs = {"prompt_ids": torch.tensor([prompt] * len(mb)), "prompt_mask": torch.ones(len(mb), P, dtype=torch.long),
                  "completion_ids": completions[sel], "completion_mask": torch.ones(len(mb), C, dtype=torch.long),
                  "advantages": adv[sel], "old_per_token_logps": old[sel], "ref_per_token_logps": ref[sel],
                  "num_items_in_batch": torch.tensor(float(len(mb) * C)),
                  "importance_sampling_ratio": torch.exp(offsets[sel]).clamp(max=2.0)}
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        theirs = torch.cat([p.grad.flatten() for p in model.parameters()])
        mine = torch.cat([gr.flatten() for gr in grads])
        assert metrics[f"update/{update + 1}/loss"] == pytest.approx(float(loss), rel=1e-4, abs=1e-7), update
        scale = float(theirs.abs().max())
        assert torch.allclose(mine, theirs, rtol=1e-3, atol=1e-5 * scale), (update, float((mine - theirs).abs().max()), scale)
        assert math.isfinite(float(loss))
