"""One GRPO step, top to bottom: groups in, advantages, packed token rows, loss, update.

Only tokens the model sampled are trained (their recorded ids, with the logprobs recorded
when they were sampled as the "old" policy); prompts, tool results and user turns are
context. Several trajectories share a row (no padding to the longest) and attention never
crosses from one to the next: each segment's position ids restart at 0, which transformers
turns into a block-diagonal causal mask. Rows are filled up to a token budget, so memory
stays bounded whatever the group size; gradients accumulate over rows.

Losses (``loss=``):
  grpo     PPO-clip, eps 0.2, mean over each sequence then over sequences
  dr_grpo  PPO-clip, sum over tokens / (sequences x longest completion), no std scaling
  dapo     PPO-clip with clip-higher (0.2 / 0.28), mean over all tokens
  gspo     sequence-level ratio exp(mean log-ratio), clip 3e-4 / 4e-4, mean over sequences
  cispo    -clip(ratio, 1-eps, 1+eps_high).detach() * A * logp, eps 1, eps_high 4 (default)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from artsdk.trajectory import Group, Trajectory

log = logging.getLogger("artsdk.local")

LOSSES = {
    # name: (eps low, eps high, normalisation)
    "grpo": (0.2, 0.2, "sequence"),
    "dr_grpo": (0.2, 0.2, "constant"),
    "dapo": (0.2, 0.28, "token"),
    "gspo": (3e-4, 4e-4, "sequence"),
    "cispo": (1.0, 4.0, "token"),
}


@dataclass
class TrainConfig:
    """Settings of a training step (any of them can be passed to ``run.train(groups, ...)``)."""

    learning_rate: float = 1e-4
    loss: str = "cispo"
    scale_rewards: bool = True  # divide advantages by the group's std (not for dr_grpo)
    epsilon: Optional[float] = None
    epsilon_high: Optional[float] = None
    beta: float = 0.0  # KL to the base model (adapter disabled); off by default
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    tokens_per_row: int = 2048  # token budget of one packed row (one forward/backward)
    seed: int = 0

    @classmethod
    def build(cls, base: "TrainConfig", overrides: dict[str, Any]) -> "TrainConfig":
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown training setting(s) {sorted(unknown)}; "
                             f"known: {sorted(cls.__dataclass_fields__)}")
        cfg = cls(**{**base.__dict__, **overrides})
        if cfg.loss not in LOSSES:
            raise ValueError(f"unknown loss {cfg.loss!r}; choose one of {sorted(LOSSES)}")
        return cfg


@dataclass
class Segment:
    """One trainable token sequence: context and sampled tokens of one trajectory."""

    tokens: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    advantage: float = 0.0
    reward: float = 0.0

    def extend(self, ids: Sequence[int], trained: bool, logprobs: Optional[Sequence[float]] = None) -> None:
        self.tokens.extend(ids)
        self.trained.extend([trained] * len(ids))
        self.old_logprobs.extend(logprobs if logprobs is not None else [math.nan] * len(ids))


# -- groups to segments -----------------------------------------------------------------

def advantages(groups: Sequence[Group], scale: bool) -> tuple[list[tuple[Trajectory, float]], int]:
    """(trajectory, advantage) of every trajectory in a group with signal, and how many
    groups were skipped for having none (all rewards equal)."""
    out, skipped = [], 0
    for g in groups:
        scored = g.scored
        if g.no_signal:
            skipped += 1
            continue
        r = torch.tensor([t.reward for t in scored], dtype=torch.float64)
        a = r - r.mean()
        if scale:
            a = a / (r.std(unbiased=False) + 1e-6)
        out.extend((t, float(x)) for t, x in zip(scored, a))
    return out, skipped


def segments(traj: Trajectory, advantage: float, prompt_ids: Callable[[Any], list[int]],
             completion_ids: Callable[[Any], list[int]], warn: Callable[[str], None]) -> list[Segment]:
    """Token sequences of one trajectory. A call whose prompt extends the previous call's
    tokens continues the same sequence (multi-turn in one row); otherwise a new one starts."""
    segs: list[Segment] = []
    cur: Optional[Segment] = None
    for call in traj.calls:
        if not call.choices or call.error:
            continue
        choice = call.choices[0]  # the answer the agent went on with
        prompt = call.prompt_token_ids
        if not prompt:
            warn("a call has no prompt token ids: retokenizing its messages")
            prompt = prompt_ids(call)
        if choice.trainable:
            ids, lps = list(choice.token_ids), list(choice.logprobs)  # type: ignore[arg-type]
        else:
            warn("a choice has no sampled token ids/logprobs: retokenizing its text (ratios taken as 1)")
            ids, lps = completion_ids(choice), None
        if cur is not None and len(prompt) >= len(cur.tokens) and prompt[:len(cur.tokens)] == cur.tokens:
            cur.extend(prompt[len(cur.tokens):], False)
        else:
            cur = Segment(advantage=advantage, reward=traj.reward or 0.0)
            segs.append(cur)
            cur.extend(prompt, False)
        cur.extend(ids, True, lps)
    return segs


def pack(segs: Sequence[Segment], budget: int) -> list[list[Segment]]:
    """First-fit decreasing: rows of segments whose lengths add up to at most ``budget``
    (a longer segment gets a row of its own)."""
    rows: list[list[Segment]] = []
    room: list[int] = []
    for s in sorted(segs, key=lambda s: -len(s.tokens)):
        n = len(s.tokens)
        for i, free in enumerate(room):
            if n <= free:
                rows[i].append(s)
                room[i] -= n
                break
        else:
            rows.append([s])
            room.append(budget - n)
    return rows


# -- the step ---------------------------------------------------------------------------

def token_logprobs(model: Any, ids: torch.Tensor, pos: torch.Tensor,
                   keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """logp[t] = log p(ids[t+1] | ids[:t+1]) within each packed segment, for every t or only
    for the positions in ``keep``: the vocabulary projection (a large share of a small
    model's compute) then runs only where a token is trained."""
    if keep is None:
        keep = torch.arange(len(ids) - 1, device=ids.device)
    logits = model(input_ids=ids[None], position_ids=pos[None], use_cache=False, logits_to_keep=keep).logits[0]
    return -F.cross_entropy(logits.float(), ids[keep + 1], reduction="none")


def train_step(model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Group], cfg: TrainConfig,
               prompt_ids: Callable[[Any], list[int]], completion_ids: Callable[[Any], list[int]],
               device: str, reference: Optional[Callable[[], Any]] = None) -> dict[str, float]:
    """One optimizer step on ``groups``; returns the step's metrics."""
    t0 = time.perf_counter()
    eps_lo, eps_hi, norm = LOSSES[cfg.loss]
    eps_lo = cfg.epsilon if cfg.epsilon is not None else eps_lo
    eps_hi = cfg.epsilon_high if cfg.epsilon_high is not None else eps_hi
    scored, skipped = advantages(groups, scale=cfg.scale_rewards and cfg.loss != "dr_grpo")
    warned: set[str] = set()

    def warn(msg: str) -> None:
        if msg not in warned:
            warned.add(msg)
            log.warning(msg)

    segs = [s for t, a in scored if a != 0.0 for s in segments(t, a, prompt_ids, completion_ids, warn)]
    all_rewards = [t.reward for g in groups for t in g.scored]
    metrics: dict[str, float] = {
        "reward_mean": float(sum(all_rewards) / len(all_rewards)) if all_rewards else math.nan,
        "reward_std": float(torch.tensor(all_rewards).std(unbiased=False)) if all_rewards else math.nan,
        "groups_trained": float(len(groups) - skipped), "groups_skipped": float(skipped),
        "trajectories": float(len(scored)), "sequences": float(len(segs)),
    }
    if scored:
        adv = torch.tensor([a for _, a in scored])
        metrics.update(advantage_mean=float(adv.mean()), advantage_std=float(adv.std(unbiased=False)),
                       advantage_abs_mean=float(adv.abs().mean()))
    n_trained = sum(sum(s.trained) for s in segs)
    if not segs or n_trained == 0:  # nothing to learn from: the same metrics, all zero
        metrics.update(loss=0.0, grad_norm=0.0, tokens_trained=0.0, tokens_total=0.0, rows=0.0,
                       clip_fraction=0.0, logprob_drift=0.0, kl=0.0, seconds=time.perf_counter() - t0)
        return metrics
    longest = max(sum(s.trained) for s in segs)
    rows = pack(segs, cfg.tokens_per_row)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "drift": 0.0, "tokens": 0.0, "row_tokens": 0.0}
    for row in rows:
        ids, pos, seg_of, trained, old, adv, w = [], [], [], [], [], [], []
        for k, s in enumerate(row):
            n = len(s.tokens)
            ids += s.tokens
            pos += range(n)
            seg_of += [k] * n
            trained += s.trained
            old += s.old_logprobs
            adv += [s.advantage] * n
            n_train = sum(s.trained)
            weight = {"token": 1.0 / n_trained, "sequence": 1.0 / (max(n_train, 1) * len(segs)),
                      "constant": 1.0 / (len(segs) * longest)}[norm]
            w += [weight] * n
        T = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        ids_t, pos_t = T(ids, torch.long), T(pos, torch.long)
        # target t is token t+1; only sampled tokens (never a segment's first) are trained
        keep = torch.nonzero(T(trained[1:], torch.bool) & (T(pos[1:], torch.long) > 0))[:, 0]
        if len(keep) == 0:
            continue
        old_t, adv_t, w_t = T(old[1:])[keep], T(adv[1:])[keep], T(w[1:])[keep]
        seg_t = T(seg_of[1:], torch.long)[keep]
        logp = token_logprobs(model, ids_t, pos_t, keep)
        old_t = torch.where(torch.isnan(old_t), logp.detach(), old_t)  # no record: ratio 1
        log_ratio = logp - old_t
        if cfg.loss == "gspo":
            # one ratio per sequence: exp(mean of its tokens' log-ratios)
            count = torch.zeros(len(row), device=device).index_add_(0, seg_t, torch.ones_like(logp))
            total = torch.zeros(len(row), device=device).index_add_(0, seg_t, log_ratio.detach())
            seq_lr = (total / count.clamp(min=1))[seg_t]
            ratio = torch.exp(seq_lr + logp - logp.detach())
        else:
            ratio = torch.exp(log_ratio)
        clipped_ratio = ratio.clamp(1 - eps_lo, 1 + eps_hi)
        if cfg.loss == "cispo":
            per_token = -clipped_ratio.detach() * adv_t * logp
        else:
            per_token = -torch.minimum(ratio * adv_t, clipped_ratio * adv_t)
        if cfg.beta > 0 and reference is not None:
            with torch.no_grad(), reference():
                ref = token_logprobs(model, ids_t, pos_t, keep)
            d = ref - logp
            kl = torch.exp(d) - d - 1
            per_token = per_token + cfg.beta * kl
            sums["kl"] += float(kl.detach().sum())
        loss = (per_token * w_t).sum()
        loss.backward()
        sums["loss"] += float(loss.detach())
        sums["clipped"] += float(((ratio < 1 - eps_lo) | (ratio > 1 + eps_hi)).sum())
        sums["drift"] += float(log_ratio.detach().abs().sum())
        sums["tokens"] += float(len(keep))
        sums["row_tokens"] += len(ids)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    metrics.update(
        loss=sums["loss"], grad_norm=float(grad_norm), tokens_trained=sums["tokens"],
        tokens_total=sums["row_tokens"], rows=float(len(rows)),
        clip_fraction=sums["clipped"] / max(sums["tokens"], 1),
        logprob_drift=sums["drift"] / max(sums["tokens"], 1),
        kl=sums["kl"] / max(sums["tokens"], 1), seconds=time.perf_counter() - t0,
    )
    return metrics
