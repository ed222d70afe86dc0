"""Supervised fine-tuning on good conversations, the warm-up before GRPO: the same LoRA
adapter, rows and optimizer as a GRPO step, with the loss the mean negative log-likelihood of
the assistant's tokens -- every other token (system, user, tool results) is context.

A trajectory's calls become sequences as for GRPO (batch.segments): the tokens this backend
sampled are trained exactly; a call answered by another model (distilling a stronger one) or a
conversation written by hand is rendered through the chat template, the assistant's answers
(with their tool calls) as the model writes them.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from artsdk.errors import TrainingError, TrajectoryError
from artsdk.trajectory import Trajectory

from .attention import packed_attention
from .batch import Segment, Tokenizing, minibatches, pack, segments, weigh
from .heap import give_back
from .shard import ALONE, Shard
from .trainer import Row, StepInterrupted, _check, _counting, _Snapshot, my_rows, norm_value


@dataclass
class SFTConfig:
    """Settings of a supervised step (any of them can be passed to ``run.train_sft(data, ...)``)."""

    # a warm-up is a few conversations: small batches, several passes (measured on docs/your-agent.md:
    # SmolLM2 went from 0 to 12 of 16 tool calls; one pass of batches of 8 left it at 0)
    learning_rate: float = 2e-4
    epochs: int = 5  # passes over the examples
    batch_size: int = 2  # examples (trajectories) per optimizer step
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    tokens_per_row: Optional[int] = None  # as for GRPO: 256 on the CPU, 4096 on a GPU
    gradient_checkpointing: bool = False
    seed: int = 0

    @classmethod
    def build(cls, overrides: dict[str, Any], seed: int = 0) -> "SFTConfig":
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown SFT setting(s) {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        cfg = cls(**{"seed": seed, **overrides})
        for name in ("learning_rate", "max_grad_norm", "weight_decay"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (value == 0 and name != "weight_decay"):
                raise ValueError(f"SFT setting {name}={value!r} must be a finite number above 0")
        for name in ("epochs", "batch_size", "tokens_per_row"):
            value = getattr(cfg, name)
            if value is None and name == "tokens_per_row":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SFT setting {name}={value!r} must be a whole number >= 1")
        return cfg


def as_examples(trajectories: Sequence[Trajectory], policy: str) -> list[Trajectory]:
    """The trajectories with every answered call made this model's: a call it served keeps its
    sampled tokens; another model's (or a hand-written one) is retokenized."""
    out = []
    for t in trajectories:
        calls = []
        for call in t.calls:
            if not call.choices or call.error or call.params.get("judge"):
                continue
            own = (call.served_by or call.model or "").partition("@")[0] == policy
            copy = call.model_copy(update={"served_by": policy, **({} if own else {"prompt_token_ids": None})})
            if not own:
                copy.choices = [c.model_copy(update={"token_ids": None, "logprobs": None}) for c in call.choices]
            calls.append(copy)
        if not calls:
            raise TrajectoryError(f"trajectory {t.id} has no answered call to learn from (an example needs at least "
                                  f"one assistant message); nothing was trained")
        out.append(t.model_copy(update={"calls": calls}))
    return out


def sft_step(model: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory], cfg: SFTConfig,
             tk: Tokenizing, device: str, stop: Optional[threading.Event] = None,
             shard: Shard = ALONE, between: Optional[Callable[[], None]] = None,
             progress: Optional[Callable[[int, int], None]] = None) -> dict[str, float]:
    """Supervised updates on ``trajectories`` (``cfg.epochs`` passes, ``cfg.batch_size`` of them
    per optimizer step); returns the metrics. Whole or absent, as a GRPO step; over several
    ranks as a GRPO step (shard.py)."""
    t0 = time.perf_counter()
    examples = as_examples(trajectories, tk.policy)
    quiet: set[str] = set()
    tk = Tokenizing(**{**tk.__dict__, "warn": quiet.add})  # retokenizing is the point here, not a warning
    per_example: list[list[Segment]] = []
    for i, t in enumerate(examples):
        segs = segments(t, 1.0, tk).segments
        for s in segs:
            s.trajectory = i
        per_example.append(segs)
    budget = cfg.tokens_per_row or (4096 if device.startswith("cuda") else 256)
    batches: list[list[Row]] = []
    for members in minibatches(len(examples), math.ceil(len(examples) / cfg.batch_size), cfg.seed):
        weigh([per_example[i] for i in members], "token", 1)
        batches.append([Row(r, device) for r in pack([per_example[i] for i in members], budget)])
    params = [p for p in model.parameters() if p.requires_grad]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model.train()
    optimizer.zero_grad(set_to_none=True)
    snapshot = _Snapshot.take(params, optimizer)
    losses, norms, tokens = [], [], 0.0
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mine = [my_rows(shard, b) for b in batches]
    between = _counting(between, progress, cfg.epochs * sum(len(m) for m in mine))
    row_stop = shard.alone(stop)  # with several ranks a stop is acted on together (shard.py)
    try:
        with packed_attention(model):
            for epoch in range(cfg.epochs):
                for batch, rows in zip(batches, mine):
                    optimizer.zero_grad(set_to_none=True)
                    loss_sum = 0.0
                    for row in rows:
                        _check(row_stop, between)
                        if len(row.keep) == 0 and not row.ghost:
                            continue
                        loss = -(row.logprobs(model) * row.weight).sum() * (0.0 if row.ghost else 1.0)
                        loss.backward()
                        loss_sum += float(loss.detach())
                    tokens += sum(len(row.keep) for row in batch) if epoch == 0 else 0
                    if shard.stopped(stop):
                        raise StepInterrupted()
                    shard.sum_grads(params)
                    loss_sum = shard.sum([loss_sum])[0]
                    grad_norm = norm_value(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
                    if not math.isfinite(loss_sum) or not torch.isfinite(grad_norm):
                        raise TrainingError(f"the SFT loss ({loss_sum}) or gradient norm ({float(grad_norm)}) is not "
                                            f"finite; the step was abandoned and no weight moved")
                    optimizer.step()
                    losses.append(loss_sum)
                    norms.append(float(grad_norm))
    except BaseException:
        snapshot.restore(optimizer)
        raise
    finally:
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_disable()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        give_back()
    per_epoch = max(len(batches), 1)
    return {"loss": sum(losses[-per_epoch:]) / per_epoch,  # the last pass's mean NLL per token
            "loss_first_epoch": sum(losses[:per_epoch]) / per_epoch, "grad_norm": sum(norms) / max(len(norms), 1),
            "examples": float(len(examples)), "tokens_trained": tokens, "updates": float(len(losses)),
            "rows": float(sum(len(b) for b in batches)), "seconds": time.perf_counter() - t0, "sft": 1.0}
