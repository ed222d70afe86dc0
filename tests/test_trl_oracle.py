"""TRL as the oracle: each loss's value and gradient, on the same batch and the same weights,
through TRL's own ``GRPOTrainer._compute_loss`` -- at every update of a step of two
mini-batches passed over twice (TRL's ``steps_per_generation=2, num_iterations=2``): the
first (ratio 1), the later ones (the ratio moved from the old policy, fixed for the whole
step; the clip range acts) -- against ours. Completions have different lengths, so the
mini-batches hold different numbers of tokens and each loss's normaliser shows; the sampler
weight is compared in TRL's per-token truncation and in its default, "sequence_mask".

Where ours differs from TRL on purpose, the test says so: in its token modes GSPO's sampler
weight is the geometric mean of the trajectory's token weights (TRL's token modes weigh each
token), so GSPO is compared in the sequence modes or without the correction; TRL's cispo
``epsilon_high`` is the ratio's upper bound itself, ours ``1 + epsilon_high``.
"""

import math

import pytest
import torch

import artsdk as art
from backends.local.batch import Tokenizing, minibatches
from backends.local.tiny import build_tiny
from backends.local.trainer import TrainConfig, train_step

trl = pytest.importorskip("trl")

P, C, B = 6, 7, 8  # prompt length, longest completion (TRL pads the others), batch size
LENGTHS = [7, 2, 5, 3, 6, 4, 7, 2]  # completion lengths: mini-batches of different token counts
GSPO = {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}
# loss: (TRL GRPOConfig settings, our TrainConfig settings, the sampler correction: (mode, cap) or None)
CASES = {
    "grpo": ({"loss_type": "grpo"}, {"loss": "grpo"}, ("token_truncate", 2.0)),
    "dr_grpo": ({"loss_type": "dr_grpo", "scale_rewards": "none"}, {"loss": "dr_grpo"}, ("token_truncate", 2.0)),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"loss": "dapo"}, ("token_truncate", 2.0)),
    "gspo": (GSPO, {"loss": "gspo"}, None),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 5.0}, {"loss": "cispo"}, ("token_truncate", 2.0)),
    "grpo+kl": ({"loss_type": "grpo", "beta": 0.1}, {"loss": "grpo", "beta": 0.1}, ("token_truncate", 2.0)),
    # TRL's default sampler correction: one weight per completion, masked to 0 above the cap
    "grpo+sequence_mask": ({"loss_type": "grpo"}, {"loss": "grpo"}, ("sequence_mask", 3.0)),
    "dapo+sequence_mask": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"loss": "dapo"}, ("sequence_mask", 3.0)),
    "gspo+sequence_truncate": (GSPO, {"loss": "gspo"}, ("sequence_truncate", 2.0)),
    "cispo+token_mask": ({"loss_type": "cispo", "epsilon_high": 5.0}, {"loss": "cispo"}, ("token_mask", 1.2)),
}


def trl_sampler_weight(offsets, mask, mode, cap):
    """TRL's importance_sampling_ratio (grpo_trainer.py, _generate_and_score_completions),
    written out: exp(old - sampler) per token, or per completion of its summed gaps; over
    the cap, truncated to it or masked to 0."""
    diff = offsets * mask
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    return ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(ratio > cap, 0.0)


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

    trl_args, ours, correction = CASES[case]
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
    completions = torch.randint(10, 400, (B, C), generator=g)  # right-padded: positions past a length are not used
    mask = (torch.arange(C)[None] < torch.tensor(LENGTHS)[:, None]).long()
    offsets = (torch.rand(B, C, generator=g) - 0.5) * 0.6
    rewards = [1.0, 0.0, 0.4, 0.7, 0.2, 0.9, 0.9, 0.1]
    with torch.no_grad():
        ids = torch.cat([torch.tensor([prompt] * B), completions], 1)
        logits = model(input_ids=ids).logits[:, P - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, completions[..., None])[..., 0]
    trajs = []
    for i, n in enumerate(LENGTHS):
        call = art.LLMCall(model="m", served_by="m@0", prompt_token_ids=prompt,
                           choices=[art.Choice(message={"role": "assistant", "content": "x"},
                                               token_ids=completions[i, :n].tolist(),
                                               logprobs=(own[i, :n] - offsets[i, :n]).tolist())])
        trajs.append(art.Trajectory(calls=[call], reward=rewards[i]))
    groups = [art.Group(trajectories=trajs[:4]), art.Group(trajectories=trajs[4:])]

    # ours: two mini-batches, two epochs: four updates, the ratio moving from the second on
    mode, cap = correction or ("token_truncate", None)
    cfg = TrainConfig(**ours, minibatches=2, epochs=2, max_grad_norm=1e9, max_completion_tokens=C,
                      is_cap=cap, is_mode=mode)
    opt = Record(model.parameters(), lr=0.3 if ours.get("beta") else 1.0)  # the KL term overflows at large steps
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
    assert metrics["updates"] == 4 and len(opt.seen) == 4
    members = minibatches(B, 2, cfg.seed)
    assert len({int(mask[mb].sum()) for mb in members}) == 2  # the mini-batches hold different token counts
    if case in ("grpo", "dapo"):
        assert max(metrics[f"update/{u}/clip_fraction"] for u in (2, 3, 4)) > 0  # clipped tokens are covered

    # TRL: a real GRPOTrainer, its _compute_loss on each mini-batch at the weights that update started from
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to=[],
                        per_device_train_batch_size=4, num_generations=4, max_completion_length=C,
                        steps_per_generation=2, num_iterations=2, **{"beta": 0.0, **trl_args})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8), processing_class=tok)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = correction is not None
    trainer.current_gradient_accumulation_steps = 1
    model.train()
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
    for update in range(4):  # the old policy is the step's first weights at every update, both epochs
        mb = members[update % 2]
        weights, grads = opt.seen[update]
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(w)
        model.zero_grad()
        sel = torch.tensor(mb)
        inputs = {"prompt_ids": torch.tensor([prompt] * len(mb)), "prompt_mask": torch.ones(len(mb), P, dtype=torch.long),
                  "completion_ids": completions[sel], "completion_mask": mask[sel],
                  "advantages": adv[sel], "old_per_token_logps": old[sel], "ref_per_token_logps": ref[sel],
                  # TRL counts the generation batch's completion tokens (both mini-batches)
                  "num_items_in_batch": mask.sum().float()}
        if correction is not None:
            inputs["importance_sampling_ratio"] = trl_sampler_weight(offsets[sel], mask[sel], *correction)
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        theirs = torch.cat([p.grad.flatten() for p in model.parameters()])
        mine = torch.cat([gr.flatten() for gr in grads])
        assert metrics[f"update/{update + 1}/loss"] == pytest.approx(float(loss), rel=1e-4, abs=1e-7), update
        scale = float(theirs.abs().max())
        assert torch.allclose(mine, theirs, rtol=1e-3, atol=1e-5 * scale), (update, float((mine - theirs).abs().max()), scale)
        assert math.isfinite(float(loss))
