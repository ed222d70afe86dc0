"""One GRPO step, top to bottom: groups in, token rows (batch.py), the old policy's
logprobs, then mini-batches of updates, each a loss over its rows and one optimizer step.

The old policy is the trainer's own: one no-grad pass over every row, before the first update,
gives the logprobs of the weights the step starts from (with a single update it is skipped:
the gradient pass's values, detached, are the same numbers); it stays fixed for every epoch.
The batch is then split into ``minibatches`` (shuffled trajectories) and passed over
``epochs`` times, one optimizer step per mini-batch: from the second update on the ratio
p / p_old moves and each loss's clip range acts. Each mini-batch is normalised as TRL
normalises it: "sequence" and "constant" over the mini-batch's own trajectories, "token"
(dapo, cispo) over the step's trained tokens divided by the number of mini-batches, so every
token weighs the same whichever mini-batch holds it. The sampler's recorded logprobs differ
from the trainer's (bf16 kernels, batch shapes, a KV cache, top-p, an older adapter when
rollouts ran during training): an importance weight ``p_old / p_sampler`` capped at
``is_cap`` (``is_mode``: per token or per trajectory, truncated or masked, TRL's four
modes), separate from the ratio (decoupled PPO), corrects for that, and the gap is reported
as ``logprob_mismatch``. The trainer's logprobs are those of the tempered distribution:
logits divided by the call's temperature.

Losses (``loss=``; A the advantage, r the ratio, w the sampler weight):
  grpo     -min(r A, clip(r, 1-eps, 1+eps_high) A) w, eps 0.2; "sequence" normalisation
  dr_grpo  as grpo, advantages not divided by the std; "constant" normalisation
  dapo     as grpo with clip-higher (0.2 / 0.28); "token" normalisation
  gspo     as grpo with one ratio per trajectory, exp(mean of its log-ratios), clip 3e-4 / 4e-4
  cispo    -clip(r, 1-eps, 1+eps_high).detach() A w log p, eps 1, eps_high 4; "token"
(normalisations in batch.weigh). A step is whole or absent: a failure or Ctrl-C part way
puts the weights and the optimizer back as they were.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from artsdk.errors import TrainingError
from artsdk.trajectory import Group

from .attention import packed_attention
from .batch import Segment, Tokenizing, advantages, minibatches, pack, segments, weigh
from .heap import give_back
from .shard import ALONE, Shard

log = logging.getLogger("artsdk.local")

LOSSES = {
    # name: (eps low, eps high, normalisation)
    "grpo": (0.2, 0.2, "sequence"),
    "dr_grpo": (0.2, 0.2, "constant"),
    "dapo": (0.2, 0.28, "token"),
    "gspo": (3e-4, 4e-4, "sequence"),
    "cispo": (1.0, 4.0, "token"),
}
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
PER_UPDATE = 64  # updates whose own figures are reported (update/<i>/...)


@dataclass
class TrainConfig:
    """Settings of a training step (any of them can be passed to ``run.train(groups, ...)``)."""

    learning_rate: float = 3e-4
    loss: str = "cispo"
    minibatches: int = 2  # optimizer steps per pass over the batch (trajectories split evenly; bench.learning)
    epochs: int = 1  # passes over the batch
    scale_rewards: bool = True  # divide advantages by the group's std (not for dr_grpo)
    epsilon: Optional[float] = None
    epsilon_high: Optional[float] = None
    beta: float = 0.0  # KL to the base model (adapter disabled); off by default
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    # token budget of one packed row (one forward/backward); None: 256 on the CPU, 4096 on a GPU.
    # Attention runs per segment, so small rows cost little speed and bound memory
    tokens_per_row: Optional[int] = None
    max_completion_tokens: int = 1024  # dr_grpo's constant normaliser
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, ~30% more time
    is_cap: Optional[float] = 2.0  # truncation of the sampler-correction weight; None: no correction
    # how the sampler weight is formed and capped, in TRL's words: per token or per trajectory (the product of
    # its tokens' weights), over the cap truncated or masked to 0 (TRL's default is "sequence_mask" at 3.0)
    is_mode: str = "token_truncate"
    max_policy_lag: Optional[int] = None  # tokens sampled more than this many steps ago are context; None: any
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
        if self.is_mode not in IS_MODES:
            raise ValueError(f"unknown is_mode {self.is_mode!r}; choose one of {list(IS_MODES)}")
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
        for name in ("tokens_per_row", "max_completion_tokens", "seed", "minibatches", "epochs", "max_policy_lag"):
            value = getattr(self, name)
            if value is None and name in ("tokens_per_row", "max_policy_lag"):
                continue
            least = {"seed": None, "max_policy_lag": 0}.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
                raise ValueError(f"training setting {name}={value!r} must be a whole number"
                                 + (f" >= {least}" if least is not None else ""))
        for name in ("scale_rewards", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"training setting {name}={getattr(self, name)!r} must be true or false")

    def clip_range(self) -> tuple[float, float]:
        """(eps low, eps high): the loss's own unless ``epsilon`` / ``epsilon_high`` are set."""
        lo, hi, _ = LOSSES[self.loss]
        return (self.epsilon if self.epsilon is not None else lo,
                self.epsilon_high if self.epsilon_high is not None else hi)


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
    """The step was asked to stop (``stop`` was set): nothing moved (what had, was put back)."""


class Row:
    """One packed row as tensors, built once and used by every pass over it: the token ids and
    positions, the trained positions (``keep``) and, per trained token, its sampler logprob,
    temperature, advantage, weight and trajectory; the old policy's logprobs (``old``) and the
    reference model's (``ref``) once computed. A ``ghost`` is a copy that takes a rank's turn
    when the weights are sharded (``my_rows``): the same passes, nothing added to the step."""

    ghost = False

    def __init__(self, segs: list[Segment], device: str) -> None:
        ids, pos, trained, sampler, temp, adv, w, unit = [], [], [], [], [], [], [], []
        for s in segs:
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
        self.ids, self.pos = T(ids, torch.long), T(pos, torch.long)
        # target t is token t+1; only sampled tokens (never a segment's first) are trained
        self.keep = torch.nonzero(T(trained[1:], torch.bool) & (self.pos[1:] > 0))[:, 0]
        k = self.keep
        self.sampler, temperature = T(sampler[1:])[k], T(temp[1:])[k]
        # tokens sampled at temperature 1 (the usual case) need no division of their logits:
        # that is a pass over [tokens, vocabulary] each way, which the limit does not make either
        self.temperature = None if bool((temperature == 1.0).all()) else temperature
        self.advantage, self.weight = T(adv[1:])[k], T(w[1:])[k]
        self.trajectory = T(unit[1:], torch.long)[k]  # the step's numbering (batch.Segment.trajectory)
        self.length = len(ids)
        self.old: Optional[torch.Tensor] = None
        self.ref: Optional[torch.Tensor] = None

    def logprobs(self, model: Any) -> torch.Tensor:
        return token_logprobs(model, self.ids, self.pos, self.keep, self.temperature)

    def as_ghost(self) -> "Row":
        twin = copy.copy(self)
        twin.ghost, twin.old, twin.ref = True, None, None
        return twin


def my_rows(shard: Shard, rows: Sequence[Row]) -> list[Row]:
    """This rank's rows of one mini-batch. With sharded weights every rank makes the same
    passes (shard.py): a rank short of rows takes ghost turns, and an empty row is a ghost too
    (alone it would be skipped, and the other ranks would wait for its pass)."""
    mine = shard.mine(rows)
    if not shard.sharded or not rows:
        return mine
    mine = [r.as_ghost() if len(r.keep) == 0 else r for r in mine]
    return mine + [rows[0].as_ghost() for _ in range(shard.turns(rows) - len(mine))]


def finite(params: Sequence[torch.Tensor], shard: Shard = ALONE) -> bool:
    """Every weight finite, on every rank (a sharded weight's own share checked here)."""
    bad = sum(not bool(torch.isfinite(getattr(p, "_local_tensor", p)).all()) for p in params)
    return not (shard.sum([bad])[0] if shard.sharded else bad)


def norm_value(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor (clip_grad_norm_ over sharded weights gives a DTensor)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@dataclass
class _Snapshot:
    """The trainable weights and the optimizer's state before the step's first update."""

    params: list[torch.Tensor]
    saved: list[torch.Tensor]
    state: dict[str, Any]

    @classmethod
    def take(cls, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> "_Snapshot":
        return cls(params, [p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for p, b in zip(self.params, self.saved):
                p.copy_(b)
        optimizer.load_state_dict(self.state)


def train_step(model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Group], cfg: TrainConfig,
               tk: Tokenizing, device: str, reference: Optional[Callable[[], Any]] = None,
               stop: Optional[threading.Event] = None, shard: Shard = ALONE,
               between: Optional[Callable[[], None]] = None,
               progress: Optional[Callable[[int, int], None]] = None) -> dict[str, float]:
    """One training step on ``groups`` (``cfg.minibatches`` x ``cfg.epochs`` optimizer steps);
    returns its metrics. Bad input raises TrajectoryError, a non-finite loss, gradient or
    weight TrainingError, and ``stop`` set (Ctrl-C) StepInterrupted at the next row: each
    with the weights and the optimizer as they were before the step. With a ``shard`` of
    several ranks, each rank trains its share of the rows and the sums are over all of them
    (shard.py): every rank makes the same step. ``between`` is called between rows (the local
    backend answers a waiting generation batch there), ``progress(rows done, rows)`` too."""
    t0 = time.perf_counter()
    eps_lo, eps_hi = cfg.clip_range()
    norm = LOSSES[cfg.loss][2]
    scored, silent = advantages(groups, scale=cfg.scale_rewards and cfg.loss != "dr_grpo")
    warned: set[str] = set()

    def warn(msg: str) -> None:
        if msg not in warned:
            warned.add(msg)
            log.warning(msg)

    tk = Tokenizing(**{**tk.__dict__, "warn": warn, "max_policy_lag": cfg.max_policy_lag})
    per_traj: list[list[Segment]] = []
    other_calls, stale, lags = 0, 0, []
    for i, (t, a) in enumerate(scored):
        tokens = segments(t, a, tk)
        for s in tokens.segments:
            s.trajectory = i
        per_traj.append(tokens.segments)
        other_calls, stale, lags = other_calls + tokens.other_calls, stale + tokens.stale_tokens, lags + tokens.lags
    # who is in the rows: trajectories with an advantage; with a KL term every one (it pulls them all)
    takes_part = [any(s.n_trained for s in segs) and (a != 0.0 or cfg.beta > 0)
                  for (_, a), segs in zip(scored, per_traj)]
    rewards = [t.reward for t, _ in scored]
    metrics: dict[str, float] = {
        "reward_mean": float(sum(rewards) / len(rewards)) if rewards else math.nan,
        "reward_std": float(torch.tensor(rewards).std(unbiased=False)) if rewards else math.nan,
        "groups_trained": float(len(groups) - silent), "groups_skipped": float(silent),
        "trajectories": float(len(scored)), "sequences": float(sum(len(per_traj[i]) for i, p in
                                                                   enumerate(takes_part) if p)),
        "calls_other_model": float(other_calls), "tokens_over_lag": float(stale),
        "policy_lag_mean": float(sum(lags) / len(lags)) if lags else 0.0,
        "policy_lag_max": float(max(lags)) if lags else 0.0,
    }
    if scored:
        adv = torch.tensor([a for _, a in scored])
        metrics.update(advantage_mean=float(adv.mean()), advantage_std=float(adv.std(unbiased=False)),
                       advantage_abs_mean=float(adv.abs().mean()))
    zero = dict(loss=0.0, grad_norm=0.0, tokens_trained=0.0, tokens_total=0.0, rows=0.0, updates=0.0,
                clip_fraction=0.0, ratio_mean=1.0, logprob_mismatch=0.0, logprob_mismatch_max=0.0,
                is_weight_mean=1.0, is_truncated=0.0, kl=0.0)
    if not any(takes_part):  # nothing to learn from: the same metrics, all zero
        metrics.update(zero, seconds=time.perf_counter() - t0)
        return metrics

    budget = cfg.tokens_per_row or (4096 if device.startswith("cuda") else 256)
    batches: list[list[Row]] = []
    groups_of_members = minibatches(len(scored), cfg.minibatches, cfg.seed + tk.step)
    # "token": each mini-batch's sum over the step's tokens per mini-batch (TRL's DAPO / CISPO normaliser)
    share = sum(s.n_trained for segs in per_traj for s in segs) / len(groups_of_members)
    for members in groups_of_members:
        weigh([per_traj[i] for i in members], norm, cfg.max_completion_tokens, token_share=share)
        units = [per_traj[i] for i in members if takes_part[i]]
        if units:
            batches.append([Row(r, device) for r in pack(units, budget)])
    rows = [r for b in batches for r in b]
    mine = [my_rows(shard, b) for b in batches]  # this rank's rows of each mini-batch
    # a trajectory longer than a row spans rows: its GSPO ratio and its sequence-level weight are over all of them
    per_sequence = cfg.loss == "gspo" or cfg.is_mode.startswith("sequence")
    spans = {int(u) for u in _spanning(rows)} if per_sequence else set()
    old_pass = len(batches) * cfg.epochs > 1 or bool(spans)

    params = [p for p in model.parameters() if p.requires_grad]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model.train()
    optimizer.zero_grad(set_to_none=True)
    snapshot = _Snapshot.take(params, optimizer)
    sums = dict.fromkeys(("loss", "clipped", "kl", "tokens", "ratio", "gap", "gap_n", "gap_max", "is_weight",
                          "is_truncated", "grad_norm"), 0.0)
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    between = _counting(between, progress, (int(old_pass) + cfg.epochs) * sum(len(b) for b in mine))
    row_stop = shard.alone(stop)  # with several ranks a stop is acted on together, at each mini-batch's end
    try:
        with packed_attention(model):
            if old_pass:  # the old policy: the weights as they are before the first update
                with torch.no_grad():
                    for row in (r for b in mine for r in b):
                        _check(row_stop, between)
                        row.old = row.logprobs(model)
                if shard.stopped(stop):
                    raise StepInterrupted()
            gap_stats = _traj_stats([r for b in mine for r in b], spans, lambda r: r.old - r.sampler,
                                    shard) if spans else {}
            update = 0
            for epoch in range(cfg.epochs):
                for batch in mine:
                    update += 1
                    optimizer.zero_grad(set_to_none=True)
                    ratio_means = {u: total / n for u, (total, n) in _traj_stats(
                        batch, spans, lambda r: r.logprobs(model) - r.old, shard).items()} if spans else {}
                    figures = dict.fromkeys(("loss", "clipped", "ratio", "tokens", "kl"), 0.0)
                    for row in batch:
                        _check(row_stop, between)
                        _row_loss(model, row, cfg, eps_lo, eps_hi, reference, figures, sums if epoch == 0 else None,
                                  ratio_means, gap_stats)
                    if shard.stopped(stop):
                        raise StepInterrupted()
                    shard.sum_grads(params)
                    figures = dict(zip(figures, shard.sum(list(figures.values()))))
                    grad_norm = norm_value(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
                    if not math.isfinite(figures["loss"]) or not torch.isfinite(grad_norm):
                        raise TrainingError(f"the loss ({figures['loss']}) or the gradient norm ({float(grad_norm)}) "
                                            f"is not finite; the step was abandoned and no weight moved")
                    optimizer.step()
                    if not finite(params, shard):
                        raise TrainingError("the update made some weights non-finite (is the learning rate far too "
                                            "large?); it was undone and the step abandoned")
                    for key in ("loss", "clipped", "ratio", "tokens", "kl"):
                        sums[key] += figures[key]
                    sums["grad_norm"] += float(grad_norm)
                    if update <= PER_UPDATE and len(batches) * cfg.epochs > 1:
                        n = max(figures["tokens"], 1)
                        metrics.update({f"update/{update}/loss": figures["loss"],
                                        f"update/{update}/clip_fraction": figures["clipped"] / n,
                                        f"update/{update}/ratio_mean": figures["ratio"] / n,
                                        f"update/{update}/grad_norm": float(grad_norm)})
    except BaseException:
        snapshot.restore(optimizer)  # a step is whole or absent
        raise
    finally:
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_disable()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        give_back()
    once = ("is_weight", "is_truncated", "gap", "gap_n")  # added up by each rank over its own rows
    sums.update(zip(once, shard.sum([sums[k] for k in once])))
    sums["gap_max"] = shard.max([sums["gap_max"]])[0]
    trained = max(sum(len(r.keep) for r in rows), 1)
    seen = max(sums["tokens"], 1)
    metrics.update(
        loss=sums["loss"] / update, grad_norm=sums["grad_norm"] / update, updates=float(update),
        tokens_trained=float(sum(len(r.keep) for r in rows)), tokens_total=float(sum(r.length for r in rows)),
        rows=float(len(rows)), clip_fraction=sums["clipped"] / seen, ratio_mean=sums["ratio"] / seen,
        kl=sums["kl"] / seen, logprob_mismatch=sums["gap"] / max(sums["gap_n"], 1),
        logprob_mismatch_max=sums["gap_max"], is_weight_mean=sums["is_weight"] / trained,
        is_truncated=sums["is_truncated"] / trained, seconds=time.perf_counter() - t0,
    )
    return metrics


def _counting(between: Optional[Callable[[], None]], progress: Optional[Callable[[int, int], None]],
              total: int) -> Optional[Callable[[], None]]:
    """``between``, also telling ``progress`` how many of ``total`` rows are done."""
    if progress is None:
        return between
    done = 0

    def tick() -> None:
        nonlocal done
        progress(done, total)
        done += 1
        if between is not None:
            between()

    return tick


def _check(stop: Optional[threading.Event], between: Optional[Callable[[], None]] = None) -> None:
    if between is not None:
        between()
    if stop is not None and stop.is_set():
        raise StepInterrupted()


def _row_loss(model: Any, row: Row, cfg: TrainConfig, eps_lo: float, eps_hi: float,
              reference: Optional[Callable[[], Any]], figures: dict[str, float],
              once: Optional[dict[str, float]], ratio_means: dict[int, float],
              gap_stats: dict[int, tuple[float, float]]) -> None:
    """Forward and backward of one packed row; adds its figures to ``figures`` (this update's)
    and, on the first pass over the batch, the sampler-weight figures to ``once``. A ghost makes
    the same passes and adds nothing."""
    if len(row.keep) == 0 and not row.ghost:
        return
    if cfg.beta > 0 and reference is not None and row.ref is None:
        with torch.no_grad(), reference():  # the reference model does not change: once per row
            row.ref = row.logprobs(model)
    logp = row.logprobs(model)
    if row.ghost:
        (logp.sum() * 0.0).backward()
        return
    old = row.old if row.old is not None else logp.detach()
    recorded = ~torch.isnan(row.sampler)
    gap = torch.where(recorded, old - row.sampler, torch.zeros_like(old))  # log(p_old / p_sampler): a constant
    log_ratio = logp - old
    sequence_is = cfg.is_mode.startswith("sequence")
    if cfg.loss == "gspo" or sequence_is:
        # per trajectory (a trajectory spanning rows takes its figures over all of them): its sum of
        # sampler gaps (a sequence-level weight) or their mean (GSPO's token-mode weight), and for
        # GSPO one ratio, exp(mean of its log-ratios), with each token's gradient (GSPO-token)
        local, traj = torch.unique(row.trajectory, return_inverse=True)
        sum_gap, n_gap = _per_traj(traj, gap), _per_traj(traj, recorded.float())
        mean_lr = _per_traj(traj, log_ratio.detach()) / _per_traj(traj, torch.ones_like(old))
        for j, u in enumerate(local.tolist()):
            if u in ratio_means:
                mean_lr[j] = ratio_means[u]
            if u in gap_stats:
                sum_gap[j], n_gap[j] = gap_stats[u]
        log_w = (sum_gap if sequence_is else sum_gap / n_gap.clamp(min=1))[traj]
    else:
        log_w = gap
    ratio = torch.exp(mean_lr[traj] + logp - logp.detach()) if cfg.loss == "gspo" else torch.exp(log_ratio)
    is_w = torch.exp(log_w)
    if cfg.is_cap is not None:
        over = is_w > cfg.is_cap
        truncated = float(over.sum())
        # *_truncate: the weight is capped; *_mask: a token (or sequence) over the cap is left out
        is_w = is_w.masked_fill(over, 0.0) if cfg.is_mode.endswith("mask") else is_w.clamp(max=cfg.is_cap)
    else:
        truncated, is_w = 0.0, torch.ones_like(is_w)
    adv = row.advantage
    clipped_ratio = ratio.clamp(1 - eps_lo, 1 + eps_hi)
    if cfg.loss == "cispo":
        per_token = -clipped_ratio.detach() * adv * logp
    else:
        per_token = -torch.minimum(ratio * adv, clipped_ratio * adv)
    per_token = per_token * is_w
    if row.ref is not None:
        # k3 estimate of KL(policy || base), times the ratio (its gradient included): the gradient is
        # then the unbiased reverse-KL one under samples of the old policy (TRL's default too)
        d = row.ref - logp
        kl = (torch.exp(d) - d - 1) * ratio
        per_token = per_token + cfg.beta * kl
        figures["kl"] += float(kl.detach().sum())
    loss = (per_token * row.weight).sum()
    loss.backward()
    figures["loss"] += float(loss.detach())
    # a token is clipped when the clip bound is what its gradient sees: for the PPO-style losses the
    # bound that min() picks (TRL counts the same way); for CISPO the clamped weight, whatever the
    # advantage's sign (TRL's cispo_clip_ratio counts positive advantages only)
    if cfg.loss == "cispo":
        clipped = ((ratio < 1 - eps_lo) | (ratio > 1 + eps_hi)) & (adv != 0)
    else:
        clipped = ((ratio < 1 - eps_lo) & (adv < 0)) | ((ratio > 1 + eps_hi) & (adv > 0))
    figures["clipped"] += float(clipped.sum())
    figures["ratio"] += float(ratio.detach().sum())
    figures["tokens"] += float(len(row.keep))
    if once is not None:
        once["is_weight"] += float(is_w.sum())
        once["is_truncated"] += truncated
        if bool(recorded.any()):
            g = gap[recorded].abs()
            once["gap"] += float(g.sum())
            once["gap_n"] += float(len(g))
            once["gap_max"] = max(once["gap_max"], float(g.max()))


def _spanning(rows: Sequence[Row]) -> set[int]:
    """Trajectories whose trained tokens are in more than one row."""
    seen: dict[int, int] = {}
    out: set[int] = set()
    for i, row in enumerate(rows):
        for u in torch.unique(row.trajectory).tolist():
            if seen.setdefault(u, i) != i:
                out.add(u)
    return out


def _traj_stats(rows: Sequence[Row], which: set[int], value: Callable[[Row], torch.Tensor],
                shard: Shard = ALONE) -> dict[int, tuple[float, float]]:
    """Per trajectory in ``which``: (sum, count) of ``value(row)`` over its trained tokens in
    ``rows`` (this rank's; summed over ranks) -- no gradient; NaN values, from tokens without a
    recorded sampler logprob, do not count. With sharded weights every row's ``value`` is
    computed (a pass is a collective) and a ghost's does not count."""
    wanted = torch.tensor(sorted(which), dtype=torch.long)
    sums: dict[int, list[float]] = {u: [0.0, 0.0] for u in sorted(which)}
    with torch.no_grad():
        for row in rows:
            mine = torch.isin(row.trajectory, wanted.to(row.trajectory.device)) & (not row.ghost)
            if not bool(mine.any()) and not shard.sharded:
                continue
            v = value(row)
            ok = mine & ~torch.isnan(v)
            for u in torch.unique(row.trajectory[ok]).tolist():
                sel = ok & (row.trajectory == u)
                acc = sums.setdefault(u, [0.0, 0.0])
                acc[0] += float(v[sel].sum())
                acc[1] += float(sel.sum())
    keys = sorted(sums)
    total = shard.sum([x for u in keys for x in sums[u]])
    return {u: (total[2 * i], total[2 * i + 1]) for i, u in enumerate(keys) if total[2 * i + 1]}


def _per_traj(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` per trajectory of a row."""
    return torch.zeros(int(index.max()) + 1, dtype=values.dtype, device=values.device).index_add_(0, index, values)
