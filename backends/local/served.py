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

from artsdk.backend import TrainableModel
from artsdk.errors import BackendError, TrainingError

from .batch import Tokenizing
from .checkpoints import Checkpoints
from .continuation import Continuations
from .engine import Completion, Request
from .policy import Policy, lora_settings
from .sft import SFTConfig, sft_step
from .trainer import StepInterrupted, TrainConfig, train_step

log = logging.getLogger("artsdk.local")


class ServedModel:
    def __init__(self, spec: TrainableModel, *, home: Path, cache: Path, device: str, dtype: Any,
                 keep_checkpoints: int, best_metric: Optional[str], train_defaults: TrainConfig,
                 engine: Callable[["ServedModel"], Any], resume_step: Optional[int] = None,
                 trainable: bool = True) -> None:
        self.spec = spec
        self.trainable = trainable  # False: served only, its weights held by the engine's own process (vLLM)
        self.device = device
        lora_settings(spec.config)  # bad settings are refused before anything is written
        self.train_config = TrainConfig.build(train_defaults, spec.config.get("train", {}))
        self.checkpoints = Checkpoints(home / spec.project / spec.name / "checkpoints")
        # the newest checkpoint (or resume_step), every file read before the (slow) model load:
        # one that cannot be read fails fast, naming the file and the newest step that can
        latest = self.checkpoints.resume_point(resume_step)
        if latest is not None:
            trained_from = self.checkpoints.state(latest).get("model", {}).get("base_model")
            if trained_from not in (None, spec.base_model):
                raise BackendError(
                    f"the checkpoints in {self.checkpoints.folder} were trained from base model "
                    f"{trained_from!r}, not {spec.base_model!r}; give the model another name "
                    f"(or project), or move that folder away to start over")
        self.policy = policy = (Policy(spec, cache=cache, device=device, dtype=dtype, train_config=self.train_config)
                                if trainable else Policy.serving_only(spec, cache=cache))
        self.model, self.tokenizer, self.chat = policy.model, policy.tokenizer, policy.chat
        self.continuations = Continuations(self.chat)  # answers given, for the next turn's prompt
        self.optimizer, self.lora_config, self.context_length = policy.optimizer, policy.lora_config, policy.context_length
        self.keep_checkpoints = keep_checkpoints
        self.best_metric = best_metric
        self.step = 0
        self.published: set[int] = set()  # steps with an adapter in the engine
        self.pins: dict[int, int] = {}  # step -> requests submitted on it and not yet answered
        self._pin_lock = threading.Lock()  # makes "newest step" and "pinned" one atomic act
        # a replica behind a router keeps older steps until the router, which pins requests to
        # steps before they reach it, says none is in flight (release)
        self.hold_steps = False
        self._released: set[int] = set()
        self._train_lock = threading.Lock()  # one training step at a time per model
        # set by close(): a step in flight stops at its next row, or is not committed, so a model
        # deleted while it trains never writes into the folder of one registered after it
        self._closing = threading.Event()
        self.training_progress: Optional[tuple[int, int]] = None  # (rows done, rows) of the step training now
        if latest is not None:
            state = (self.checkpoints.load(latest, self.model, self.optimizer) if trainable
                     else self.checkpoints.state(latest))
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

    def _publish(self, step: int, folder: Path, weights: Optional[dict[str, Any]] = None) -> None:
        """Have the engine serve ``step`` from its checkpoint ``folder`` (the built-in engine: from
        the policy adapter, or ``weights``, that folder's adapter already read)."""
        self.engine.publish(step, folder, weights)
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
        """Let go of the adapter of an old step no request pins (hold ``_pin_lock``); with
        ``hold_steps``, only of a step ``release`` let go."""
        if self.hold_steps and step not in self._released:
            return
        if step != self.step and step in self.published and not self.pins.get(step):
            self.published.discard(step)
            self._released.discard(step)
            self.engine.retire(step)

    def release(self, step: int) -> None:
        """With ``hold_steps``: retire ``step`` (not the newest) now, or when its last pinned
        request is answered."""
        with self._pin_lock:
            if step != self.step:
                self._released.add(step)
                self._retire(step)

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
        self._check_trainable()
        cfg = TrainConfig.build(self.train_config, overrides)
        for g in self.optimizer.param_groups:  # the step's own settings, which run.train may override
            g["lr"], g["weight_decay"] = cfg.learning_rate, cfg.weight_decay
        with self._train_lock:
            self._check_open()
            with self.engine.training():
                self.model.set_adapter("policy")
                metrics = self._abandoned_if_closed(lambda s: train_step(
                    self.model, self.optimizer, groups, cfg, self.tokenizing(), device=self.device,
                    reference=self.model.disable_adapter, stop=s, between=self._lend,
                    progress=self._progress), stop)
            self.training_progress = None
            if not metrics["tokens_trained"]:
                return self.step, metrics, None
            return self._commit_step(metrics)

    def train_sft(self, trajectories: list[Any], overrides: dict[str, Any],
                  stop: Optional[threading.Event] = None) -> tuple[int, dict[str, float], str]:
        """A supervised step on good conversations (sft.py): (new step, metrics, checkpoint),
        numbered, checkpointed and served like a GRPO step."""
        self._check_trainable()
        cfg = SFTConfig.build(overrides, seed=self.train_config.seed)
        for g in self.optimizer.param_groups:
            g["lr"], g["weight_decay"] = cfg.learning_rate, cfg.weight_decay
        with self._train_lock:
            self._check_open()
            with self.engine.training():
                self.model.set_adapter("policy")
                metrics = self._abandoned_if_closed(lambda s: sft_step(
                    self.model, self.optimizer, trajectories, cfg, self.tokenizing(), device=self.device, stop=s,
                    between=self._lend, progress=self._progress), stop)
            self.training_progress = None
            return self._commit_step(metrics)

    def _progress(self, done: int, total: int) -> None:
        self.training_progress = (done, total)

    def _lend(self) -> None:
        """Between a step's rows: a generation batch that waits runs now, on the adapters it
        asked for (the policy adapter training updates is not one of them), then training goes
        on as it was -- so rollouts never stall for a whole step (``run.loop``)."""
        engine = self.engine
        wanting = getattr(engine, "wanting", None)
        if wanting is None or not wanting.is_set():
            return
        from .attention import plain_attention

        was_training = self.model.training
        with plain_attention(self.model):
            self.model.eval()
            try:
                engine.lend()
            finally:
                if engine.merger is not None:
                    engine.merger.restore()
                self.model.set_adapter("policy")
                if was_training:
                    self.model.train()

    def _abandoned_if_closed(self, step: Callable[[Any], dict[str, float]],
                             stop: Optional[threading.Event]) -> dict[str, float]:
        """``step(stop)``, stopped by the caller's ``stop`` or by ``close``."""
        either = _Either(stop, self._closing)
        try:
            return step(either)
        except StepInterrupted:
            self._check_open()
            raise

    def _check_trainable(self) -> None:
        if not self.trainable:
            raise BackendError(f"model {self.spec.name!r} is only served here (serve_only: its weights are in vLLM's "
                               f"process, none to train); train it where it is trainable")

    def _check_open(self) -> None:
        if self._closing.is_set():
            raise TrainingError(f"model {self.spec.name!r} was unregistered while this step trained: the step was "
                                f"abandoned and nothing of it was written")

    def _commit_step(self, metrics: dict[str, float]) -> tuple[int, dict[str, float], str]:
        self._check_open()
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
        return self.policy.tokenizing(self.step)

    def close(self) -> None:
        """Stop serving. A step in flight is abandoned at its next row (or finishes writing its
        checkpoint, into this model's folder, if it had begun to) before this returns."""
        self._closing.set()
        with self._train_lock:
            self.engine.close()


class _Either:
    """Set when either event is (what the trainer's ``stop`` needs: ``is_set``)."""

    def __init__(self, *events: Optional[threading.Event]) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)
