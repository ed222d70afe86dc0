"""A trainer rank: a Ray actor holding the model being trained (policy.py) and its share of
every step. The ranks form one torch.distributed group (gloo on CPUs, NCCL on GPUs); each
trains its share of each mini-batch's rows and the sums are taken over all of them
(backends/local/shard.py), so every rank makes the step one process would make. With
``shard = "fsdp"`` the base model and the adapter are sharded over the ranks
(backends/local/fsdp.py): each holds about 1/N of the model, checkpoints gather the adapter.

A step is two-phase: ``train`` makes it and keeps a snapshot of the weights before it;
``commit`` (once the checkpoint is written and the replicas serve it) lets the snapshot go,
``rollback`` puts the weights back. A submission of a step a rank has already made answers
with that step's figures instead of training again. ``interrupt`` (Ctrl-C) stops a step under
way: the ranks stop together at the end of a mini-batch, each with its weights put back.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from artsdk.backend import TrainableModel


class TrainerRank:
    """One rank of the trainer group (wrapped with ``ray.remote`` by the backend)."""

    def __init__(self, spec: dict[str, Any], rank: int, world: int, options: dict[str, Any]) -> None:
        import torch

        from backends.local import models
        from backends.local.checkpoints import Checkpoints
        from backends.local.policy import Policy
        from backends.local.shard import Shard
        from backends.local.trainer import TrainConfig

        if options.get("threads"):
            torch.set_num_threads(int(options["threads"]))
        self.spec = TrainableModel(**spec)
        self.rank, self.world = rank, world
        self.sharded = options.get("shard") == "fsdp"
        self.colocated = bool(options.get("colocated"))  # a replica beside it uses its devices between steps
        self.shard = Shard(rank, world, sharded=self.sharded)
        self.device = models.pick_device(options.get("device", "auto"))
        dtype = models.pick_dtype(self.device, options.get("dtype"))
        defaults = TrainConfig.build(TrainConfig(), options.get("train_defaults", {}))
        self.train_config = TrainConfig.build(defaults, self.spec.config.get("train", {}))
        cache = Path(options.get("cache") or Path.home() / ".cache" / "artsdk")
        # sharded: loaded into memory, then each rank's share moves to the device (join)
        self.policy = Policy(self.spec, cache=cache, device="cpu" if self.sharded else self.device, dtype=dtype,
                             train_config=self.train_config)
        self.checkpoints = Checkpoints(Path(tempfile.mkdtemp(prefix=f"artsdk-rank{rank}-")))
        self.step = 0
        self.made: dict[int, dict[str, float]] = {}  # the figures of the last steps made (for a duplicate)
        self.pending: Optional[tuple[int, Any, dict[str, float]]] = None  # (step, snapshot, figures)
        self.running: Optional[tuple[int, threading.Event]] = None  # the step under way, and its stop

    # -- the group -------------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        """Where the process group meets (asked of rank 0): this node and a free port."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, s.getsockname()[1]

    def join(self, ip: str, port: int, timeout_s: float = 300.0) -> int:
        import torch.distributed as dist

        dist.init_process_group("nccl" if self.device.startswith("cuda") else "gloo",
                                init_method=f"tcp://{ip}:{port}", rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=timeout_s))
        if self.sharded:
            from backends.local import fsdp

            fsdp.shard(self.policy, self.device)
        return self.rank

    def load(self, step: int, files: dict[str, bytes]) -> int:
        """Start from a checkpoint's files (the adapter, the optimizer, the trainer state)."""
        self.checkpoints.write(step, files)
        self.checkpoints.load(step, self.policy.model, self.policy.optimizer, put=self._scatter if self.sharded else None)
        self.checkpoints.remove(step)
        self.step, self.pending = step, None
        return step

    # -- steps -----------------------------------------------------------------------------

    def train(self, step: int, groups: list[Any], overrides: dict[str, Any]) -> dict[str, float]:
        """Make ``step`` (a GRPO step on ``groups``); its figures. Nothing moves when there is
        nothing to learn from (``tokens_trained`` 0)."""
        from backends.local.trainer import TrainConfig, train_step

        def run(cfg: TrainConfig, stop: threading.Event) -> dict[str, float]:
            return train_step(self.policy.model, self.policy.optimizer, groups, cfg, self.policy.tokenizing(self.step),
                              device=self.device, reference=self.policy.model.disable_adapter, stop=stop,
                              shard=self.shard)

        return self._make(step, lambda: TrainConfig.build(self.train_config, overrides), run,
                          lambda m: m["tokens_trained"] > 0)

    def sft(self, step: int, trajectories: list[Any], overrides: dict[str, Any]) -> dict[str, float]:
        """Make ``step`` a supervised one (backends/local/sft.py)."""
        from backends.local.sft import SFTConfig, sft_step

        def run(cfg: SFTConfig, stop: threading.Event) -> dict[str, float]:
            return sft_step(self.policy.model, self.policy.optimizer, trajectories, cfg,
                            self.policy.tokenizing(self.step), device=self.device, stop=stop, shard=self.shard)

        return self._make(step, lambda: SFTConfig.build(overrides, seed=self.train_config.seed), run, lambda m: True)

    def _make(self, step: int, settings: Any, run: Any, moved: Any) -> dict[str, float]:
        if step in self.made:  # submitted again (a retry): the step it already is
            return self.made[step]
        if self.pending is not None and self.pending[0] == step:
            return self.pending[2]
        if self.pending is not None or step != self.step + 1:
            raise RuntimeError(f"trainer rank {self.rank} is at step {self.step}"
                               + (f" with step {self.pending[0]} not yet committed" if self.pending else "")
                               + f"; it cannot make step {step}")
        from backends.local.trainer import _Snapshot

        cfg = settings()
        for g in self.policy.optimizer.param_groups:  # the step's own settings
            g["lr"], g["weight_decay"] = cfg.learning_rate, cfg.weight_decay
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        snapshot = _Snapshot.take(params, self.policy.optimizer)
        self.policy.model.set_adapter("policy")
        from backends.local import fsdp

        self.running = (step, threading.Event())
        try:
            metrics = {**run(cfg, self.running[1]), **fsdp.held(self.policy.model)}  # (what this rank holds)
        finally:
            self.running = None
            if self.colocated and self.device.startswith("cuda"):  # the memory the step cached, for vLLM
                import torch

                torch.cuda.empty_cache()
        if moved(metrics):
            self.pending = (step, snapshot, metrics)
        return metrics

    def interrupt(self, step: int) -> bool:
        """Ask ``step``, under way, to stop (its caller was cancelled): the ranks stop together
        at the end of the mini-batch in hand, each with its weights as before the step, and the
        step raises StepInterrupted. Called in the actor's "control" concurrency group, beside
        the step; False when ``step`` is not under way (not yet begun, or done)."""
        running = self.running
        if running is None or running[0] != step:
            return False
        running[1].set()
        return True

    def _scatter(self, weights: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        from backends.local import fsdp

        fsdp.scatter(self.policy.model, self.policy.optimizer, weights, optimizer_state)

    def checkpoint(self, step: int, state: dict[str, Any]) -> dict[str, bytes]:
        """The files of the pending step's checkpoint (rank 0 is asked, or with sharded weights
        every rank, since gathering them is a collective: rank 0 answers with the files, the
        others with none; the backend writes them)."""
        if self.pending is None or self.pending[0] != step:
            raise RuntimeError(f"trainer rank {self.rank} has no step {step} to checkpoint")
        whole = None
        if self.sharded:
            from backends.local import fsdp

            whole = fsdp.gather(self.policy.model, self.policy.optimizer)
            if self.rank:
                return {}
        self.checkpoints.save(step, self.policy.model, self.policy.optimizer, state, whole=whole)
        files = self.checkpoints.files(step)
        self.checkpoints.remove(step)
        return files

    def commit(self, step: int) -> int:
        if self.pending is not None and self.pending[0] == step:
            self.made[step] = self.pending[2]
            for old in sorted(self.made)[:-8]:
                del self.made[old]
            self.step, self.pending = step, None
        return self.step

    def rollback(self) -> int:
        """Put the weights and the optimizer back as they were before the pending step."""
        if self.pending is not None:
            self.pending[1].restore(self.policy.optimizer)
            self.pending = None
        return self.step

    def close(self) -> None:
        """Remove this rank's scratch folder (the backend asks before it ends the actor)."""
        shutil.rmtree(self.checkpoints.folder, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        import os

        import ray
        import resource

        from backends.local import fsdp

        return {"rank": self.rank, "step": self.step, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id(), "pending": self.pending[0] if self.pending else None, **fsdp.held(self.policy.model),
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # (Linux: KiB)
                "rss_gb": _resident_gb()}


def _resident_gb() -> float:
    """This process's resident memory now (Linux; 0 where /proc is absent)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        return 0.0
