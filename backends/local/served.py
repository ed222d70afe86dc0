"""One trainable model held by the local backend: base model + LoRA adapters, tokenizer,
inference engine, optimizer and checkpoints.

Adapters: ``policy`` is the one the optimizer updates; after each step its weights are
copied into a serving adapter. Requests are pinned to the newest step when they arrive; a
serving adapter no request uses any more is reused for a later step. Step 0 is the base model.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from artsdk.backend import TrainableModel
from artsdk.errors import BackendError

from . import models
from .chat import ChatFormat, message_text
from .checkpoints import Checkpoints
from .engine import Engine
from .merge import Merger
from .trainer import TrainConfig, train_step

log = logging.getLogger("artsdk.local")

LORA_DEFAULTS = {"rank": 8, "alpha": 16, "target_modules": "all-linear", "dropout": 0.0}


class ServedModel:
    def __init__(self, spec: TrainableModel, *, home: Path, cache: Path, device: str, dtype: Any,
                 max_batch: int, keep_checkpoints: int, best_metric: Optional[str],
                 train_defaults: TrainConfig, merge: bool = True) -> None:
        from peft import LoraConfig, get_peft_model

        self.spec = spec
        self.device = device
        self.checkpoints = Checkpoints(home / spec.project / spec.name / "checkpoints")
        latest = self.checkpoints.latest()
        if latest is not None:  # checked before the (slow) model load: fail fast
            trained_from = self.checkpoints.state(latest).get("model", {}).get("base_model")
            if trained_from not in (None, spec.base_model):
                raise BackendError(
                    f"the checkpoints in {self.checkpoints.folder} were trained from base model "
                    f"{trained_from!r}, not {spec.base_model!r}; give the model another name "
                    f"(or project), or move that folder away to start over")
        lora = {**LORA_DEFAULTS, **spec.config.get("lora", {})}
        base, self.tokenizer = models.load(spec.base_model, cache.expanduser(), device, dtype)
        self.context_length = int(getattr(base.config, "max_position_embeddings", 2048) or 2048)
        self.lora_config = LoraConfig(r=int(lora["rank"]), lora_alpha=int(lora["alpha"]),
                                      target_modules=lora["target_modules"], lora_dropout=float(lora["dropout"]),
                                      bias="none", task_type="CAUSAL_LM")
        self.train_config = TrainConfig.build(train_defaults, spec.config.get("train", {}))
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
        self.slots: dict[int, str] = {}  # step -> serving adapter
        self.free: list[str] = []  # serving adapters no step uses any more
        self._train_lock = threading.Lock()  # one training step at a time per model
        if latest is not None:
            state = self.checkpoints.load(latest, self.model, self.optimizer)
            self.step = int(state["step"])
            self._publish(self.step)
            log.info("%s: resumed from checkpoint step %d", spec.name, self.step)
        self.merger = Merger(self.model) if merge else None
        self.engine = Engine(self.model, self.tokenizer, self.chat.stop_ids, device,
                             max_batch=max_batch, adapter_for=self._adapter_for, merger=self.merger)

    # -- adapters -----------------------------------------------------------------------

    def _adapter_for(self, step: int) -> Optional[str]:
        return None if step == 0 else self.slots[step]

    @property
    def serving(self) -> set[int]:
        """Steps that can be asked for now (0 is the base model)."""
        return {0, *self.slots}

    def _publish(self, step: int) -> None:
        """Copy the trained weights into a serving adapter for ``step`` (caller holds the
        engine lock, or the engine is not running yet). Adapters of retired steps are
        reused: creating one allocates and initialises a LoRA pair in every layer."""
        if self.free:
            name = self.free.pop()
        else:
            name = f"s{len(self.slots) + len(self.free)}"
            while name in self.model.peft_config:
                name += "x"
            self.model.add_adapter(name, self.lora_config)
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for key, p in params.items():
                if f".{name}." in key:
                    p.copy_(params[key.replace(f".{name}.", ".policy.")])
        self.slots[step] = name

    def _retire(self) -> None:
        in_use = self.engine.in_use
        for step in sorted(self.slots):
            if step != self.step and in_use.get(step, 0) == 0:
                self.free.append(self.slots.pop(step))

    # -- training -----------------------------------------------------------------------

    def train(self, groups: list[Any], overrides: dict[str, Any]) -> tuple[int, dict[str, float], str]:
        cfg = TrainConfig.build(self.train_config, overrides)
        for g in self.optimizer.param_groups:
            g["lr"] = cfg.learning_rate
        with self._train_lock:
            with self.engine.lock:
                if self.merger is not None:
                    self.merger.restore()  # training (and the KL reference) needs the base weights
                self.model.set_adapter("policy")
                metrics = train_step(
                    self.model, self.optimizer, groups, cfg,
                    prompt_ids=lambda call: self.chat.prompt_ids(call.messages, call.tools),
                    completion_ids=self._completion_ids, device=self.device,
                    reference=self.model.disable_adapter,
                )
                step = self.step + 1
                path = self.checkpoints.save(step, self.model, self.optimizer,
                                             {"metrics": metrics, "model": self.spec.model_dump()})
                self._publish(step)
                self.step = step
                self._retire()
            self.checkpoints.prune(self.keep_checkpoints, self.best_metric)
        return step, metrics, str(path)

    def _completion_ids(self, choice: Any) -> list[int]:
        text = message_text(choice.message)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids + [self.chat.end_id]

    def close(self) -> None:
        self.engine.close()
