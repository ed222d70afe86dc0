"""One trainable model held by the local backend: base model + LoRA adapter, tokenizer,
inference engine, optimizer and checkpoints.

Adapters: ``policy`` is the one the optimizer updates; after each step it is checkpointed
and the engine publishes it as that step (the built-in engine copies it into a serving
adapter, vLLM loads it from the checkpoint). A request is pinned to its step (the newest
when it names none) from the moment it is submitted until it is answered, whatever training
does meanwhile; the engine retires an old step's adapter once no request pins it. Step 0 is
the base model.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from artsdk.backend import TrainableModel
from artsdk.errors import BackendError

from . import models
from .chat import ChatFormat, message_text
from .checkpoints import Checkpoints
from .engine import Completion, Request
from .batch import Tokenizing
from .sft import SFTConfig, sft_step
from .trainer import TrainConfig, train_step

log = logging.getLogger("artsdk.local")

LORA_DEFAULTS = {"rank": 8, "alpha": 16, "target_modules": "all-linear", "dropout": 0.0}


def lora_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``TrainableModel.config`` checked: only "lora" and "train" sections, and the LoRA
    values of the right types (ValueError names the bad one)."""
    unknown = set(config) - {"lora", "train"}
    if unknown:
        raise ValueError(f"unknown model setting(s) {sorted(unknown)}; known: ['lora', 'train']")
    for section in ("lora", "train"):
        if not isinstance(config.get(section, {}), dict):
            raise ValueError(f"config[{section!r}] must be a table of settings, got {config[section]!r}")
    lora = config.get("lora", {})
    unknown = set(lora) - set(LORA_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown LoRA setting(s) {sorted(unknown)}; known: {sorted(LORA_DEFAULTS)}")
    lora = {**LORA_DEFAULTS, **lora}
    rank, alpha, dropout, targets = lora["rank"], lora["alpha"], lora["dropout"], lora["target_modules"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 1024:
        raise ValueError(f"LoRA rank must be a whole number from 1 to 1024, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1e4:
        raise ValueError(f"LoRA alpha must be a number above 0, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"LoRA dropout must be a number from 0 to below 1, got {dropout!r}")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets
                                          and all(isinstance(t, str) for t in targets))):
        raise ValueError(f"LoRA target_modules must be \"all-linear\" or a list of module names, got {targets!r}")
    return lora


class ServedModel:
    def __init__(self, spec: TrainableModel, *, home: Path, cache: Path, device: str, dtype: Any,
                 keep_checkpoints: int, best_metric: Optional[str], train_defaults: TrainConfig,
                 engine: Callable[["ServedModel"], Any]) -> None:
        from peft import LoraConfig, get_peft_model

        self.spec = spec
        self.device = device
        lora = lora_settings(spec.config)  # bad settings are refused before anything is written
        self.train_config = TrainConfig.build(train_defaults, spec.config.get("train", {}))
        self.checkpoints = Checkpoints(home / spec.project / spec.name / "checkpoints")
        latest = self.checkpoints.latest()
        if latest is not None:  # checked before the (slow) model load: fail fast
            trained_from = self.checkpoints.state(latest).get("model", {}).get("base_model")
            if trained_from not in (None, spec.base_model):
                raise BackendError(
                    f"the checkpoints in {self.checkpoints.folder} were trained from base model "
                    f"{trained_from!r}, not {spec.base_model!r}; give the model another name "
                    f"(or project), or move that folder away to start over")
        base, self.tokenizer = models.load(spec.base_model, cache.expanduser(), device, dtype)
        self.context_length = int(getattr(base.config, "max_position_embeddings", 2048) or 2048)
        self.lora_config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                                      target_modules=lora["target_modules"], lora_dropout=float(lora["dropout"]),
                                      bias="none", task_type="CAUSAL_LM")
        with torch.random.fork_rng(devices=[]):
            # the adapter's random init depends on the seed alone: runs are reproducible
            torch.manual_seed(self.train_config.seed)
            self.model = get_peft_model(base, self.lora_config, adapter_name="policy")
        self.model.eval()
        self.chat = ChatFormat(self.tokenizer)
        params = [p for n, p in self.model.named_parameters() if "lora_" in n and ".policy." in n]
        self.optimizer = torch.optim.AdamW(params, lr=self.train_config.learning_rate,
                                           weight_decay=self.train_config.weight_decay)
        self.keep_checkpoints = keep_checkpoints
        self.best_metric = best_metric
        self.step = 0
        self.published: set[int] = set()  # steps with an adapter in the engine
        self.pins: dict[int, int] = {}  # step -> requests submitted on it and not yet answered
        self._pin_lock = threading.Lock()  # makes "newest step" and "pinned" one atomic act
        self._train_lock = threading.Lock()  # one training step at a time per model
        if latest is not None:
            state = self.checkpoints.load(latest, self.model, self.optimizer)
            self.step = int(state["step"])
            log.info("%s: resumed from checkpoint step %d", spec.name, self.step)
        self.engine = engine(self)  # built-in or vLLM (backend.py picks)
        self.merger = getattr(self.engine, "merger", None)
        if self.step:
            self._publish(self.step, self.checkpoints.path(self.step))

    # -- adapters -----------------------------------------------------------------------

    @property
    def serving(self) -> set[int]:
        """Steps that can be asked for now (0 is the base model)."""
        return {0, *self.published}

    def _publish(self, step: int, folder: Path) -> None:
        """Have the engine serve ``step`` from its checkpoint ``folder``."""
        self.engine.publish(step, folder)
        with self._pin_lock:
            self.published.add(step)

    def pin(self, step: Optional[int] = None) -> int:
        """Keep ``step`` (default: the newest) served until ``unpin``; returns it. ValueError
        when that step is no longer served."""
        with self._pin_lock:
            step = self.step if step is None else step
            if step not in self.serving:
                raise ValueError(f"step {step} is not being served (serving {sorted(self.serving)})")
            self.pins[step] = self.pins.get(step, 0) + 1
            return step

    def unpin(self, step: int) -> None:
        with self._pin_lock:
            self.pins[step] -= 1
            if not self.pins[step]:
                del self.pins[step]
                self._retire(step)

    def _retire(self, step: int) -> None:
        """Let go of the adapter of an old step no request pins (hold ``_pin_lock``)."""
        if step != self.step and step in self.published and not self.pins.get(step):
            self.published.discard(step)
            self.engine.retire(step)

    def submit(self, req: Request, step: Optional[int] = None) -> "Future[list[Completion]]":
        """Generate on ``step`` (default: the newest), pinned until the answer is complete;
        sets ``req.step``."""
        req.step = self.pin(step)
        try:
            future = self.engine.submit(req)
        except BaseException:
            self.unpin(req.step)
            raise
        future.add_done_callback(lambda _: self.unpin(req.step))
        return future

    def _advance(self, step: int) -> None:
        """Make ``step`` the newest and retire the serving adapters no request pins."""
        with self._pin_lock:
            self.step = step
            for old in sorted(self.published):
                self._retire(old)

    # -- training -----------------------------------------------------------------------

    def train(self, groups: list[Any], overrides: dict[str, Any],
              stop: Optional[threading.Event] = None) -> tuple[int, dict[str, float], Optional[str]]:
        """One step: (new step, metrics, checkpoint folder). A batch with nothing to learn
        from moves nothing: (the same step, metrics, None). ``stop`` set before the update
        raises StepInterrupted, with nothing moved or written."""
        cfg = TrainConfig.build(self.train_config, overrides)
        for g in self.optimizer.param_groups:  # the step's own settings, which run.train may override
            g["lr"], g["weight_decay"] = cfg.learning_rate, cfg.weight_decay
        with self._train_lock:
            with self.engine.training():
                self.model.set_adapter("policy")
                metrics = train_step(self.model, self.optimizer, groups, cfg, self.tokenizing(),
                                     device=self.device, reference=self.model.disable_adapter, stop=stop)
            if not metrics["tokens_trained"]:
                return self.step, metrics, None
            return self._commit_step(metrics)

    def train_sft(self, trajectories: list[Any], overrides: dict[str, Any],
                  stop: Optional[threading.Event] = None) -> tuple[int, dict[str, float], str]:
        """A supervised step on good conversations (sft.py): (new step, metrics, checkpoint),
        numbered, checkpointed and served like a GRPO step."""
        cfg = SFTConfig.build(overrides, seed=self.train_config.seed)
        for g in self.optimizer.param_groups:
            g["lr"], g["weight_decay"] = cfg.learning_rate, cfg.weight_decay
        with self._train_lock:
            with self.engine.training():
                self.model.set_adapter("policy")
                metrics = sft_step(self.model, self.optimizer, trajectories, cfg, self.tokenizing(),
                                   device=self.device, stop=stop)
            return self._commit_step(metrics)

    def _commit_step(self, metrics: dict[str, float]) -> tuple[int, dict[str, float], str]:
        step = self.step + 1
        # written before the step is served: a crash never leaves a served step without its checkpoint
        path = self.checkpoints.save(step, self.model, self.optimizer,
                                     {"metrics": metrics, "model": self.spec.model_dump()})
        self._publish(step, path)
        self._advance(step)
        self.checkpoints.prune(self.keep_checkpoints, self.best_metric)
        return step, metrics, str(path)

    def tokenizing(self) -> Tokenizing:
        """What the trainer needs to turn this model's trajectories into tokens."""
        return Tokenizing(policy=self.spec.name, vocab_size=self.model.get_input_embeddings().weight.shape[0],
                          context_length=self.context_length, step=self.step,
                          prompt_ids=self.chat.prompt_ids,
                          completion_ids=self._completion_ids)

    def _completion_ids(self, choice: Any) -> list[int]:
        text = message_text(choice.message)
        return self.chat.encode(text) + [self.chat.end_id]

    def close(self) -> None:
        self.engine.close()
