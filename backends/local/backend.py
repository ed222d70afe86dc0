"""``LocalBackend``: the default backend. It serves each registered model on an
OpenAI-compatible endpoint in this process and trains its LoRA adapter with GRPO, on the
CPU or one GPU (chosen automatically; ``device="cpu"`` / ``"cuda"`` to override).

```toml
backend = "local"
[backend_options]
device = "auto"          # or "cpu", "cuda", "cuda:1"
port = 0                 # 0: any free port on 127.0.0.1
cache = "~/.cache/artsdk" # converted base models (also ARTSDK_CACHE)
keep_checkpoints = 3     # newest N checkpoints kept (plus the best by best_metric, if set)
engine = "builtin"       # or "vllm": vLLM in a process of its own (pip install artsdk[vllm])
prefix_cache_mb = 512    # the built-in engine's cache of earlier turns' keys and values (0: off)
malloc_arenas = 2        # glibc's malloc arenas for the process (0: glibc's default; heap.py)
malloc_mmap_kb = 4096    # allocations this large get pages of their own (0: glibc's sliding threshold)
api_key = "..."          # the key its server checks (default: a fresh random one, in endpoint.api_key)
docs = false             # true: the server also serves /docs and /openapi.json
```

Model settings go in ``TrainableModel.config``: ``{"lora": {"rank": 8, "alpha": 16,
"target_modules": "all-linear"}, "train": {"learning_rate": 3e-4, "loss": "cispo", ...}}``.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import anyio

from artsdk.backend import Endpoint, TrainableModel, TrainResult, nothing_to_train
from artsdk.errors import ArtError, BackendError
from artsdk.trajectory import Group, Trajectory

from ..http import ServerThread, session_key
from .checkpoints import move_aside
from .heap import limit_arenas, map_from
from .served import ServedModel
from .trainer import TrainConfig

log = logging.getLogger("artsdk.local")


class LocalBackend:
    """See the module docs. Implements ``artsdk.Backend``."""

    def __init__(self, *, device: Optional[str] = "auto", dtype: Optional[str] = None,
                 host: str = "127.0.0.1", port: int = 0, api_key: Optional[str] = None,
                 home: Optional[str] = None, max_batch: int = 64, keep_checkpoints: int = 3,
                 best_metric: Optional[str] = None, threads: Optional[int] = None,
                 cache: Optional[str] = None, http: bool = True, merge_adapters: bool = True,
                 engine: str = "builtin", vllm: Optional[dict[str, Any]] = None, prefix_cache_mb: int = 512,
                 serve_only: bool = False, docs: bool = False, malloc_arenas: int = 2,
                 malloc_mmap_kb: int = 4096, **train_defaults: Any) -> None:
        from artsdk.config import settings

        from . import models

        for name, value in (("malloc_arenas", malloc_arenas), ("malloc_mmap_kb", malloc_mmap_kb)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BackendError(f"local backend: {name}={value!r} must be a whole number >= 0 (0: glibc's own "
                                   f"{'limit' if name == 'malloc_arenas' else 'threshold'})")
        # before this backend's threads allocate: memory one frees, another reuses; a training
        # step's larger activations on pages of their own, given back when freed
        limit_arenas(malloc_arenas)
        map_from(malloc_mmap_kb)
        self.device = models.pick_device(device)
        self.dtype = models.pick_dtype(self.device, dtype)
        self.home = Path(home or settings().home)
        # converted / built base models, shared by every project of this user
        self.cache = Path(cache or os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk")
        # a server of its own checks a key, a fresh random one unless one is given; mounted in
        # another's server (http=False: artsdk serve), that server checks its own
        self.host, self.port, self.docs = host, port, docs
        self.api_key = session_key(api_key) if http else api_key
        self.max_batch, self.keep_checkpoints, self.best_metric = max_batch, keep_checkpoints, best_metric
        try:
            self.train_defaults = TrainConfig.build(TrainConfig(), train_defaults)
        except ValueError as e:
            raise BackendError(f"local backend: {e}") from None
        if engine not in ("builtin", "vllm"):
            raise BackendError(f"local backend: unknown engine {engine!r}; use \"builtin\" or \"vllm\"")
        if vllm and engine != "vllm":
            raise BackendError("local backend: vllm options are set but engine is not \"vllm\"")
        self.engine = engine
        if serve_only and engine != "vllm":
            raise BackendError("local backend: serve_only needs engine = \"vllm\" (the built-in engine runs the "
                               "model in this process, so it holds it whole anyway)")
        self.serve_only = serve_only  # no weights in this process: steps trained elsewhere are served (ray replicas)
        if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int) or prefix_cache_mb < 0:
            raise BackendError(f"local backend: prefix_cache_mb={prefix_cache_mb!r} must be a whole number of MB "
                               f"(0 turns the prefix cache off)")
        self.prefix_cache_mb = prefix_cache_mb
        if engine == "vllm":
            from .vllm_engine import VLLMOptions

            try:
                self.vllm = VLLMOptions.parse(vllm or {})
            except ValueError as e:
                raise BackendError(f"local backend: {e}") from None
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.models: dict[str, ServedModel] = {}
        self.http = http  # False: the caller mounts app() in its own server (artsdk serve)
        self.merge_adapters = merge_adapters  # serve adapters merged into the weights (faster decoding)
        self._server: Any = None
        self._app: Any = None
        self._lock = threading.Lock()
        from ..endpoint_record import EndpointRecord

        self.calls = EndpointRecord()  # every call the server answered, by rollout

    # -- Backend protocol -----------------------------------------------------------------

    async def register(self, model: TrainableModel, *, fresh: bool = False,
                       resume_step: Optional[int] = None) -> Endpoint:
        moved = None
        if fresh:  # from the base model: what is loaded goes, its checkpoints are moved aside
            await self.unregister(model)
            moved = move_aside(self.home / model.project / model.name / "checkpoints")
        elif resume_step is not None:  # from that step: the steps after it are moved aside
            await self.unregister(model)
        served = self.models.get(model.name)
        if served is None:
            served = await anyio.to_thread.run_sync(self._load, model, resume_step)
        base_url = self._ensure_server() if self.http else ""
        return Endpoint(base_url=base_url, api_key=self.api_key or "artsdk", model=model.name,
                        moved_aside=str(moved) if moved else None)

    def app(self) -> Any:
        """The OpenAI-compatible ASGI app serving every registered model."""
        from .server import build_app

        if self._app is None:
            self._app = build_app(lambda: self.models, self.api_key, self.calls, docs=self.docs)
        return self._app

    def _load(self, model: TrainableModel, resume_step: Optional[int] = None) -> ServedModel:
        with self._lock:
            if model.name not in self.models:
                try:
                    self.models[model.name] = ServedModel(
                        model, home=self.home, cache=self.cache, device=self.device, dtype=self.dtype,
                        keep_checkpoints=self.keep_checkpoints, best_metric=self.best_metric,
                        train_defaults=self.train_defaults, engine=self._engine_for, resume_step=resume_step,
                        trainable=not self.serve_only)
                except ValueError as e:
                    raise BackendError(f"model {model.name!r}: {e}") from None
            return self.models[model.name]

    def _engine_for(self, served: ServedModel) -> Any:
        """The inference engine of a model being loaded."""
        if self.engine == "vllm":
            from .vllm_engine import VLLMEngine

            return VLLMEngine(served, self.vllm, cache=self.cache, dtype=self.dtype)
        import torch

        from .engine import Engine
        from .merge import Merger

        # merged adapters only in fp32: in bf16 or fp16 the sum W + B A rounds most of a small
        # update away (after two steps at lr 1e-4 in bf16, 90% of the merged weights were
        # bit-identical to the base), so the adapter is served unmerged
        merger = Merger(served.model) if self.merge_adapters and self.dtype == torch.float32 else None
        from .prefix_cache import PrefixCache

        cache = PrefixCache(self.prefix_cache_mb * 2**20) if self.prefix_cache_mb else None
        return Engine(served.model, served.tokenizer, served.chat.stop_ids, self.device,
                      max_batch=self.max_batch, merger=merger, prefix_cache=cache)

    def _ensure_server(self) -> str:
        with self._lock:
            if self._server is None:
                self._server = ServerThread(self.app(), self.host, self.port)
            return self._server.base_url

    async def train(self, model: TrainableModel, groups: Sequence[Group], **config: Any) -> TrainResult:
        served = self.models.get(model.name)
        if served is None:
            raise BackendError(f"model {model.name!r} is not registered with this backend; open a session first")
        try:
            step, metrics, path = await _interruptible(served.train, list(groups), config)
        except ArtError:  # TrajectoryError, TrainingError: they name the culprit already
            raise
        except ValueError as e:  # a bad setting
            raise BackendError(f"training {model.name!r}: {e}") from None
        return TrainResult(step=step, metrics=metrics, checkpoint=path, trained=path is not None,
                           reason=None if path is not None else nothing_to_train(groups, metrics),
                           groups_trained=int(metrics.get("groups_trained", 0)),
                           groups_skipped=int(metrics.get("groups_skipped", 0)))

    async def train_sft(self, model: TrainableModel, trajectories: Sequence[Trajectory], **config: Any) -> TrainResult:
        served = self.models.get(model.name)
        if served is None:
            raise BackendError(f"model {model.name!r} is not registered with this backend; open a session first")
        try:
            step, metrics, path = await _interruptible(served.train_sft, list(trajectories), config)
        except ArtError:
            raise
        except ValueError as e:  # a bad setting
            raise BackendError(f"SFT of {model.name!r}: {e}") from None
        return TrainResult(step=step, metrics=metrics, checkpoint=path)

    async def step(self, model: TrainableModel) -> int:
        served = self.models.get(model.name)
        return served.step if served is not None else 0

    def progress(self, model: TrainableModel) -> Optional[tuple[int, int]]:
        """(rows done, rows) of the step ``model`` is training now; None when it trains none."""
        served = self.models.get(model.name)
        return served.training_progress if served is not None else None

    async def endpoint_calls(self, rollout_id: str) -> list[Any]:
        """The calls this backend's server answered for the rollout ``rollout_id``, in the order
        they arrived (taken: the rollout counts as ended; a later call is logged as late)."""
        return self.calls.take(rollout_id)

    def checkpoint_dir(self, model: TrainableModel, step: int) -> Path:
        """The folder of one checkpoint (BackendError when there is none)."""
        served = self.models.get(model.name)
        folder = (served.checkpoints.path(step) if served is not None
                  else self.home / model.project / model.name / "checkpoints" / str(step))
        if not (folder / "trainer_state.json").is_file():
            raise BackendError(f"model {model.name!r} has no checkpoint for step {step}")
        return folder

    def checkpoint_steps(self, model: TrainableModel) -> list[int]:
        served = self.models.get(model.name)
        if served is not None:
            return served.checkpoints.steps()
        from .checkpoints import Checkpoints

        folder = self.home / model.project / model.name / "checkpoints"
        return Checkpoints(folder).steps() if folder.is_dir() else []

    async def unregister(self, model: TrainableModel) -> None:
        """Stop serving a model and free its memory (its checkpoints stay on disk)."""
        served = self.models.pop(model.name, None)
        if served is not None:
            await anyio.to_thread.run_sync(served.close)

    async def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for served in self.models.values():
            served.close()
        self.models.clear()

    @property
    def base_url(self) -> Optional[str]:
        return self._server.base_url if self._server is not None else None


async def _interruptible(fn: Any, *args: Any) -> Any:
    """``fn(*args, stop)`` in a worker thread. If the caller is cancelled (Ctrl-C), ``stop``
    is set and the cancellation waits (a second or two, one packed row) for the step to
    give up before its update, so a step is whole or absent."""
    stop, done = threading.Event(), threading.Event()

    def work() -> Any:
        try:
            return fn(*args, stop)
        finally:
            done.set()

    try:
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        stop.set()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(done.wait, 120)
        raise

