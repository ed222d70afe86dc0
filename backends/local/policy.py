"""The model being trained: the base model with its LoRA adapter (named ``policy``, its random
initialisation set by the training seed alone, so runs are reproducible), its tokenizer and
chat format, and the AdamW optimizer over the adapter's weights. The local backend serves and
trains one; each trainer rank of a distributed backend holds one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from artsdk.backend import TrainableModel

from . import models
from .batch import Tokenizing
from .chat import ChatFormat, message_text
from .trainer import TrainConfig

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


class Policy:
    """Base model + LoRA adapter + optimizer (see the module docs)."""

    def __init__(self, spec: TrainableModel, *, cache: Path, device: str, dtype: Any, train_config: TrainConfig) -> None:
        from peft import get_peft_model

        self.spec = spec
        lora = lora_settings(spec.config)
        base, self.tokenizer = models.load(spec.base_model, cache.expanduser(), device, dtype)
        self.context_length = int(getattr(base.config, "max_position_embeddings", 2048) or 2048)
        self.lora_config = _lora_config(lora)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train_config.seed)
            self.model = get_peft_model(base, self.lora_config, adapter_name="policy")
        self.model.eval()
        self.chat = ChatFormat(self.tokenizer)
        params = [p for n, p in self.model.named_parameters() if "lora_" in n and ".policy." in n]
        self.optimizer = torch.optim.AdamW(params, lr=train_config.learning_rate,
                                           weight_decay=train_config.weight_decay)

    @classmethod
    def serving_only(cls, spec: TrainableModel, *, cache: Path) -> "Policy":
        """The model's tokenizer, chat format and adapter settings without its weights (``model``
        and ``optimizer`` None): for a server whose engine holds the model in another process
        (vLLM) and which never trains -- a replica of the ray backend."""
        self = cls.__new__(cls)
        self.spec = spec
        self.lora_config = _lora_config(lora_settings(spec.config))
        self.tokenizer, config = models.load_tokenizer(spec.base_model, cache.expanduser())
        self.context_length = int(getattr(config, "max_position_embeddings", 2048) or 2048)
        self.model = self.optimizer = None
        self.chat = ChatFormat(self.tokenizer)
        return self

    def tokenizing(self, step: int) -> Tokenizing:
        """What the trainer needs to turn this model's trajectories into tokens, at ``step``."""
        return Tokenizing(policy=self.spec.name, vocab_size=self.model.get_input_embeddings().weight.shape[0],
                          context_length=self.context_length, step=step, prompt_ids=self.chat.prompt_ids,
                          completion_ids=self.completion_ids)

    def completion_ids(self, choice: Any) -> list[int]:
        text = message_text(choice.message)
        return self.chat.encode(text) + [self.chat.end_id]


def _lora_config(lora: dict[str, Any]) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"],
                      lora_dropout=float(lora["dropout"]), bias="none", task_type="CAUSAL_LM")
