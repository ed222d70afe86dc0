"""One GRPO step, top to bottom: groups in, advantages, packed token rows, loss, update.

Only tokens this model sampled are trained (their recorded ids), in the calls it served
(``served_by`` names it); prompts, tool results, user turns and other models' answers are
context. Several trajectories share a row (no padding to the longest) and attention never
crosses from one to the next: each segment's position ids restart at 0 and attention runs
segment by segment (attention.py). Rows are filled up to a token budget, so memory stays
bounded whatever the group size; gradients accumulate over rows.

The "old" policy of the ratio is the trainer's own: each call makes one optimizer step, so
the old logprobs are the gradient pass's values detached -- the same weights, packing and
kernels a separate no-grad pass would use, without its cost. The ratio is exactly 1 and its
gradient is the policy gradient. The sampler's recorded logprobs differ from the trainer's
(bf16 kernels, batch shapes, a KV cache, an older adapter when rollouts ran during training):
a truncated importance weight ``min(p_trainer / p_sampler, is_cap)`` corrects for that, and
the gap is reported as ``logprob_mismatch``. Logprobs are those of the distribution that was
sampled: logits divided by the call's temperature.

Losses (``loss=``), each normalised over every scored trajectory of the step (N of them;
a trajectory with advantage 0 adds nothing to the sum but counts in N):
  grpo     PPO-clip, eps 0.2; each trajectory's tokens weigh 1 / (N |o|)
  dr_grpo  PPO-clip, no std scaling; every token weighs 1 / (N max_completion_tokens)
  dapo     PPO-clip with clip-higher (0.2 / 0.28); every token weighs 1 / (tokens of all N)
  gspo     one ratio per trajectory, exp(mean log-ratio), clip 3e-4 / 4e-4; as grpo
  cispo    -clip(ratio, 1-eps, 1+eps_high).detach() * A * logp, eps 1, eps_high 4; as dapo
|o| counts the trajectory's trained tokens over all its segments (a multi-turn trajectory
split in two weighs what it would in one).
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from artsdk.errors import TrainingError, TrajectoryError
from artsdk.response_items import whole_conversation
from artsdk.trajectory import Group, LLMCall, Trajectory

from .attention import packed_attention
from .engine import MIN_TEMPERATURE

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

    learning_rate: float = 3e-4
    loss: str = "cispo"
    scale_rewards: bool = True  # divide advantages by the group's std (not for dr_grpo)
    epsilon: Optional[float] = None
    epsilon_high: Optional[float] = None
    beta: float = 0.0  # KL to the base model (adapter disabled); off by default
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    # token budget of one packed row (one forward/backward); None: 512 on the CPU, 4096 on a GPU.
    # Attention runs per segment, so small rows cost little speed and bound memory
    tokens_per_row: Optional[int] = None
    max_completion_tokens: int = 1024  # dr_grpo's constant normaliser
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, ~30% more time
    is_cap: Optional[float] = 2.0  # truncation of the sampler-correction weight; None: no correction
    seed: int = 0

    @classmethod
    def build(cls, base: "TrainConfig", overrides: dict[str, Any]) -> "TrainConfig":
        """``base`` with ``overrides`` applied, every value checked (ValueError names the bad one)."""
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown training setting(s) {sorted(unknown)}; "
                             f"known: {sorted(cls.__dataclass_fields__)}")
        cfg = cls(**{**base.__dict__, **overrides})
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; choose one of {sorted(LOSSES)}")
        numbers = {"learning_rate": (self.learning_rate, False), "max_grad_norm": (self.max_grad_norm, False),
                   "beta": (self.beta, True), "weight_decay": (self.weight_decay, True),
                   "epsilon": (self.epsilon, True), "epsilon_high": (self.epsilon_high, True),
                   "is_cap": (self.is_cap, False)}
        for name, (value, zero_ok) in numbers.items():
            if value is None and name in ("epsilon", "epsilon_high", "is_cap"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (value == 0 and not zero_ok):
                need = "a finite number >= 0" if zero_ok else "a finite number > 0"
                raise ValueError(f"training setting {name}={value!r} must be {need}")
        if self.learning_rate > 1:
            raise ValueError(f"training setting learning_rate={self.learning_rate!r} must be at most 1 "
                             f"(AdamW on a LoRA adapter learns at 1e-5 to 1e-3)")
        if self.is_cap is not None and self.is_cap < 1:
            raise ValueError(f"training setting is_cap={self.is_cap!r} must be at least 1 (or None)")
        for name in ("tokens_per_row", "max_completion_tokens", "seed"):
            value = getattr(self, name)
            if value is None and name == "tokens_per_row":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and name != "seed"):
                raise ValueError(f"training setting {name}={value!r} must be a whole number"
                                 + (" >= 1" if name != "seed" else ""))
        for name in ("scale_rewards", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"training setting {name}={getattr(self, name)!r} must be true or false")


@dataclass
class Segment:
    """One token sequence of one trajectory: context and the tokens its calls sampled."""

    tokens: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)  # nan: not recorded
    temperature: list[float] = field(default_factory=list)
    advantage: float = 0.0
    trajectory: int = 0  # which scored trajectory of the step it belongs to
    weight: float = 0.0  # of each trained token in the loss

    def extend(self, ids: Sequence[int], trained: bool, logprobs: Optional[Sequence[float]] = None,
               temperature: float = 1.0) -> None:
        self.tokens.extend(ids)
        self.trained.extend([trained] * len(ids))
        self.sampler_logprobs.extend(logprobs if logprobs is not None else [math.nan] * len(ids))
        self.temperature.extend([temperature] * len(ids))

    @property
    def n_trained(self) -> int:
        return sum(self.trained)


# -- groups to segments -----------------------------------------------------------------

def advantages(groups: Sequence[Group], scale: bool) -> tuple[list[tuple[Trajectory, float]], int]:
    """(trajectory, advantage) of every scored trajectory -- 0 in a group with no signal --
    and how many groups had none (all rewards equal)."""
    out, silent = [], 0
    for g in groups:
        scored = g.scored
        for t in scored:
            if not isinstance(t.reward, (int, float)) or not math.isfinite(t.reward) or abs(t.reward) > 1e30:
                raise TrajectoryError(f"trajectory {t.id} has reward {t.reward!r}: rewards must be finite "
                                      f"numbers (check the reward functions); nothing was trained")
        if g.no_signal:
            silent += 1
            out.extend((t, 0.0) for t in scored)
            continue
        r = torch.tensor([t.reward for t in scored], dtype=torch.float64)
        a = r - r.mean()
        if scale:
            a = a / (r.std(unbiased=False) + 1e-6)
        out.extend((t, float(x)) for t, x in zip(scored, a))
    return out, silent


def is_policy_call(call: LLMCall, policy: str) -> bool:
    """True when ``policy`` answered this call (``served_by`` is ``policy`` or ``policy@step``;
    a hand-made call without ``served_by`` is judged by the model it asked for)."""
    return (call.served_by or call.model or "").partition("@")[0] == policy


def temperature_of(call: LLMCall) -> float:
    """The temperature a call sampled at (1 when unset; greedy calls are scored at 1), as
    the engine applied it."""
    t = call.params.get("temperature")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
        return 1.0
    return max(float(t), MIN_TEMPERATURE)


@dataclass
class Tokenizing:
    """What turning a trajectory into tokens needs from the model being trained."""

    policy: str  # the model's name: only calls it served are trained
    prompt_ids: Callable[[list[Any], Any], list[int]]  # (messages, tools): fallback when a call has no prompt ids
    completion_ids: Callable[[Any], list[int]]  # fallback when a choice has no sampled ids
    vocab_size: int
    context_length: int
    warn: Callable[[str], None] = log.warning


def segments(traj: Trajectory, advantage: float, tk: Tokenizing) -> tuple[list[Segment], int]:
    """Token sequences of one trajectory, and how many of its calls another model answered.
    A call whose prompt extends the previous call's tokens continues the same sequence
    (multi-turn in one row); otherwise a new one starts."""
    segs: list[Segment] = []
    cur: Optional[Segment] = None
    other = 0
    for n, call in enumerate(traj.calls):
        if not call.choices or call.error:
            continue
        if not is_policy_call(call, tk.policy):
            other += 1  # its answer reaches training only as context of a later call's prompt
            continue
        choice = call.choices[0]  # the answer the agent went on with
        prompt = call.prompt_token_ids
        if not prompt:
            tk.warn("a call has no prompt token ids: retokenizing its messages")
            prompt = tk.prompt_ids(whole_conversation(traj.calls, call), call.tools)
        if choice.trainable:
            ids, lps = list(choice.token_ids), list(choice.logprobs)  # type: ignore[arg-type]
            bad = next((x for x in lps if not math.isfinite(x) or x > 1e-3), None)
            if bad is not None:
                raise TrajectoryError(f"trajectory {traj.id}, call {n}: sampled logprob {bad!r} is not a "
                                      f"finite log-probability; nothing was trained")
        else:
            tk.warn("a choice has no sampled token ids/logprobs: retokenizing its text (no sampler correction)")
            ids, lps = tk.completion_ids(choice), None
        wrong = next((x for x in (*prompt, *ids) if isinstance(x, bool) or not isinstance(x, int)
                      or not 0 <= x < tk.vocab_size), None)
        if wrong is not None:
            raise TrajectoryError(f"trajectory {traj.id}, call {n}: token id {wrong!r} is outside the model's "
                                  f"vocabulary (0..{tk.vocab_size - 1}); was it sampled by another model? "
                                  f"Nothing was trained")
        if cur is not None and len(prompt) >= len(cur.tokens) and prompt[:len(cur.tokens)] == cur.tokens:
            cur.extend(prompt[len(cur.tokens):], False)
        else:
            cur = Segment(advantage=advantage)
            segs.append(cur)
            cur.extend(prompt, False)
        cur.extend(ids, True, lps, temperature_of(call))
        if len(cur.tokens) > tk.context_length:
            raise TrajectoryError(f"trajectory {traj.id}, call {n}: {len(cur.tokens)} tokens, longer than the "
                                  f"model's context of {tk.context_length}; shorten the conversation (the "
                                  f"server refuses such prompts too). Nothing was trained")
    return segs, other


def weigh(trajectories: Sequence[list[Segment]], norm: str, max_completion_tokens: int) -> None:
    """Set every segment's per-token weight so that the loss is the chosen normalisation's
    mean over all scored trajectories (see the module docs)."""
    n = max(len(trajectories), 1)
    counts = [sum(s.n_trained for s in segs) for segs in trajectories]
    total = max(sum(counts), 1)
    for segs, count in zip(trajectories, counts):
        w = {"token": 1.0 / total, "sequence": 1.0 / (n * max(count, 1)),
             "constant": 1.0 / (n * max_completion_tokens)}[norm]
        for s in segs:
            s.weight = w


def pack(units: Sequence[list[Segment]], budget: int) -> list[list[Segment]]:
    """First-fit decreasing: rows whose lengths add up to at most ``budget``. A trajectory's
    segments stay in one row when they fit in one (GSPO's ratio is per trajectory); a longer
    segment gets a row of its own."""
    items: list[list[Segment]] = []
    for u in units:
        if sum(len(s.tokens) for s in u) <= budget:
            items.append(list(u))
        else:
            items.extend([s] for s in u)
    rows: list[list[Segment]] = []
    room: list[int] = []
    for item in sorted(items, key=lambda it: -sum(len(s.tokens) for s in it)):
        n = sum(len(s.tokens) for s in item)
        for i, free in enumerate(room):
            if n <= free:
                rows[i].extend(item)
                room[i] -= n
                break
        else:
            rows.append(list(item))
            room.append(budget - n)
    return rows


# -- the step ---------------------------------------------------------------------------

def token_logprobs(model: Any, ids: torch.Tensor, pos: torch.Tensor, keep: Optional[torch.Tensor] = None,
                   temperature: Optional[torch.Tensor] = None) -> torch.Tensor:
    """logp[t] = log p(ids[t+1] | ids[:t+1]) within each packed segment, for every t or only
    for the positions in ``keep``, at ``temperature`` (one per kept position; 1 if None):
    the vocabulary projection (a large share of a small model's compute) then runs only
    where a token is trained."""
    if keep is None:
        keep = torch.arange(len(ids) - 1, device=ids.device)
    logits = model(input_ids=ids[None], position_ids=pos[None], use_cache=False, logits_to_keep=keep).logits[0]
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature[:, None]
    return -F.cross_entropy(logits, ids[keep + 1], reduction="none")


class StepInterrupted(Exception):
    """The step was asked to stop (``stop`` was set) before its update: nothing moved."""


def train_step(model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Group], cfg: TrainConfig,
               tk: Tokenizing, device: str, reference: Optional[Callable[[], Any]] = None,
               stop: Optional[threading.Event] = None) -> dict[str, float]:
    """One optimizer step on ``groups``; returns the step's metrics. Bad input raises
    TrajectoryError and a non-finite loss or gradient TrainingError, before any weight moves;
    ``stop`` set (Ctrl-C) raises StepInterrupted at the next row, also before any weight moves."""
    t0 = time.perf_counter()
    eps_lo, eps_hi, norm = LOSSES[cfg.loss]
    eps_lo = cfg.epsilon if cfg.epsilon is not None else eps_lo
    eps_hi = cfg.epsilon_high if cfg.epsilon_high is not None else eps_hi
    scored, silent = advantages(groups, scale=cfg.scale_rewards and cfg.loss != "dr_grpo")
    warned: set[str] = set()

    def warn(msg: str) -> None:
        if msg not in warned:
            warned.add(msg)
            log.warning(msg)

    tk = Tokenizing(**{**tk.__dict__, "warn": warn})
    per_traj, other_calls = [], 0
    for i, (t, a) in enumerate(scored):
        segs, other = segments(t, a, tk)
        for s in segs:
            s.trajectory = i
        per_traj.append(segs)
        other_calls += other
    weigh(per_traj, norm, cfg.max_completion_tokens)
    units = [segs for (_, a), segs in zip(scored, per_traj) if a != 0.0 and segs]
    segs_trained = [s for u in units for s in u]
    all_rewards = [t.reward for t, _ in scored]
    metrics: dict[str, float] = {
        "reward_mean": float(sum(all_rewards) / len(all_rewards)) if all_rewards else math.nan,
        "reward_std": float(torch.tensor(all_rewards).std(unbiased=False)) if all_rewards else math.nan,
        "groups_trained": float(len(groups) - silent), "groups_skipped": float(silent),
        "trajectories": float(len(scored)), "sequences": float(len(segs_trained)),
        "calls_other_model": float(other_calls),
    }
    if scored:
        adv = torch.tensor([a for _, a in scored])
        metrics.update(advantage_mean=float(adv.mean()), advantage_std=float(adv.std(unbiased=False)),
                       advantage_abs_mean=float(adv.abs().mean()))
    zero = dict(loss=0.0, grad_norm=0.0, tokens_trained=0.0, tokens_total=0.0, rows=0.0, clip_fraction=0.0,
                ratio_mean=1.0, logprob_mismatch=0.0, logprob_mismatch_max=0.0, is_weight_mean=1.0,
                is_truncated=0.0, kl=0.0)
    if sum(s.n_trained for s in segs_trained) == 0:  # nothing to learn from: the same metrics, all zero
        metrics.update(zero, seconds=time.perf_counter() - t0)
        return metrics
    rows = pack(units, cfg.tokens_per_row or (4096 if device.startswith("cuda") else 512))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums = dict.fromkeys(("loss", "clipped", "kl", "tokens", "row_tokens", "ratio", "gap", "gap_n",
                          "gap_max", "is_weight", "is_truncated"), 0.0)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        with packed_attention(model):
            for row in rows:
                if stop is not None and stop.is_set():
                    raise StepInterrupted()
                _row_loss(model, row, cfg, eps_lo, eps_hi, device, reference, sums)
        if stop is not None and stop.is_set():
            raise StepInterrupted()
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if not math.isfinite(sums["loss"]) or not torch.isfinite(grad_norm):
            raise TrainingError(f"the loss ({sums['loss']}) or the gradient norm ({float(grad_norm)}) is not "
                                f"finite; the step was abandoned and no weight moved")
        _guarded_step(optimizer, params)
    finally:
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_disable()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        _release_memory()
    tokens = max(sums["tokens"], 1)
    metrics.update(
        loss=sums["loss"], grad_norm=float(grad_norm), tokens_trained=sums["tokens"],
        tokens_total=sums["row_tokens"], rows=float(len(rows)), clip_fraction=sums["clipped"] / tokens,
        ratio_mean=sums["ratio"] / tokens, kl=sums["kl"] / tokens,
        logprob_mismatch=sums["gap"] / max(sums["gap_n"], 1), logprob_mismatch_max=sums["gap_max"],
        is_weight_mean=sums["is_weight"] / tokens, is_truncated=sums["is_truncated"] / tokens,
        seconds=time.perf_counter() - t0,
    )
    return metrics


def _row_loss(model: Any, row: list[Segment], cfg: TrainConfig, eps_lo: float, eps_hi: float, device: str,
              reference: Optional[Callable[[], Any]], sums: dict[str, float]) -> None:
    """Forward and backward of one packed row; adds its figures to ``sums``."""
    ids, pos, trained, sampler, temp, adv, w, unit = [], [], [], [], [], [], [], []
    for s in row:
        n = len(s.tokens)
        ids += s.tokens
        pos += range(n)
        trained += s.trained
        sampler += s.sampler_logprobs
        temp += s.temperature
        adv += [s.advantage] * n
        w += [s.weight] * n
        unit += [s.trajectory] * n
    T = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    ids_t, pos_t = T(ids, torch.long), T(pos, torch.long)
    # target t is token t+1; only sampled tokens (never a segment's first) are trained
    keep = torch.nonzero(T(trained[1:], torch.bool) & (pos_t[1:] > 0))[:, 0]
    if len(keep) == 0:
        return
    sampler_t, temp_t = T(sampler[1:])[keep], T(temp[1:])[keep]
    adv_t, w_t = T(adv[1:])[keep], T(w[1:])[keep]
    # trajectories of this row numbered 0..k-1 (GSPO's ratio and weight are per trajectory)
    _, traj_t = torch.unique(T(unit[1:], torch.long)[keep], return_inverse=True)
    logp = token_logprobs(model, ids_t, pos_t, keep, temp_t)
    old = logp.detach()
    recorded = ~torch.isnan(sampler_t)
    gap = torch.where(recorded, old - sampler_t, torch.zeros_like(old))  # log(p_trainer / p_sampler)
    log_ratio = logp - old
    if cfg.loss == "gspo":
        # one ratio per trajectory, exp(mean of its log-ratios), with each token's gradient
        count = _per_traj(traj_t, torch.ones_like(old))
        ratio = torch.exp((_per_traj(traj_t, log_ratio.detach()) / count)[traj_t] + logp - logp.detach())
        log_w = (_per_traj(traj_t, gap) / _per_traj(traj_t, recorded.float()).clamp(min=1))[traj_t]
    else:
        ratio = torch.exp(log_ratio)
        log_w = gap
    is_w = torch.exp(log_w)
    if cfg.is_cap is not None:
        sums["is_truncated"] += float((is_w > cfg.is_cap).sum())
        is_w = is_w.clamp(max=cfg.is_cap)
    else:
        is_w = torch.ones_like(is_w)
    clipped_ratio = ratio.clamp(1 - eps_lo, 1 + eps_hi)
    if cfg.loss == "cispo":
        per_token = -clipped_ratio.detach() * adv_t * logp
    else:
        per_token = -torch.minimum(ratio * adv_t, clipped_ratio * adv_t)
    per_token = per_token * is_w
    if cfg.beta > 0 and reference is not None:
        with torch.no_grad(), reference():
            ref = token_logprobs(model, ids_t, pos_t, keep, temp_t)
        d = ref - logp
        kl = torch.exp(d) - d - 1
        per_token = per_token + cfg.beta * kl
        sums["kl"] += float(kl.detach().sum())
    loss = (per_token * w_t).sum()
    loss.backward()
    sums["loss"] += float(loss.detach())
    sums["clipped"] += float(((ratio < 1 - eps_lo) | (ratio > 1 + eps_hi)).sum())
    sums["ratio"] += float(ratio.detach().sum())
    sums["tokens"] += float(len(keep))
    sums["row_tokens"] += len(ids)
    sums["is_weight"] += float(is_w.sum())
    if bool(recorded.any()):
        g = gap[recorded].abs()
        sums["gap"] += float(g.sum())
        sums["gap_n"] += float(len(g))
        sums["gap_max"] = max(sums["gap_max"], float(g.max()))


def _guarded_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """The optimizer step, undone (weights and optimizer state) if it leaves a weight that is
    not finite: a served or saved adapter never holds one."""
    before = [p.detach().clone() for p in params]
    state = copy.deepcopy(optimizer.state_dict())
    optimizer.step()
    if all(bool(torch.isfinite(p).all()) for p in params):
        return
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    optimizer.load_state_dict(state)
    raise TrainingError("the update made some weights non-finite (is the learning rate far too large?); it "
                        "was undone and the step abandoned")


def _release_memory() -> None:
    """Give the step's freed activations back to the system: glibc keeps freed memory in
    its arenas, and a process that trained once would hold its peak for good."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _per_traj(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` per trajectory of a row."""
    return torch.zeros(int(index.max()) + 1, dtype=values.dtype, device=values.device).index_add_(0, index, values)
