"""``RayBackend``: the local backend's engine and trainer spread over a Ray cluster --
inference replicas behind one OpenAI-compatible endpoint, and trainer ranks that make each
step together -- with the same session API and the same promises: a step is whole or absent,
a request is answered by the step it was pinned to, checkpoints are written whole.

```toml
backend = "ray"
[backend_options]
address = "auto"            # an existing Ray cluster; unset: a Ray instance on this machine
replicas = 2                # inference replicas (each the local backend's engine and server)
trainers = 2                # trainer ranks (torch.distributed: gloo on CPUs, NCCL on GPUs)
replica_gpus = 1            # per replica; also replica_cpus, replica_resources = {...}
trainer_gpus = 1            # per rank; also trainer_cpus, trainer_resources = {...}
device = "auto"             # as the local backend: "cpu", "cuda"; engine = "vllm" on GPUs
shard = "fsdp"              # the model sharded over the ranks (backends/local/fsdp.py)
colocate = true             # replica i shares rank i's bundle (its GPUs) and sleeps while the ranks train
checkpoints_url = "s3://bucket/runs"   # steps committed where a new driver takes over
```

The driver (this process) holds the endpoint, writes every checkpoint (rank 0 sends the files;
no shared filesystem is needed) and is the store's one writer. With ``checkpoints_url`` each
step is committed there first (backends/shared_storage.py), and a driver started again with
the same URL resumes at the last committed step. After a step the new adapter is
loaded by every ready replica before requests for the model's name go to it; a replica that
fails to load it is drained, set up again by the health check and readmitted serving the
current step. Colocated, replica i is placed in rank i's bundle of the ranks' placement
group; during each step the replicas sleep (vLLM offloads its weights and drops its cache;
requests that reach a replica wait there), then they wake before the new adapter is
published. The health check asks every replica at once; each set-up runs on its own thread,
bounded by ``setup_timeout_s``. A replica Ray restarts (its node lost) is set up the same way before it takes
traffic. A trainer rank lost during a step abandons the step (no checkpoint, nothing served)
and the ranks start again from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Sequence

from artsdk.backend import Endpoint, TrainableModel, TrainResult, nothing_to_train
from artsdk.errors import ArtError, BackendError
from artsdk.trajectory import Group, Trajectory

from ..http import ServerThread, session_key
from ..shared_storage import SharedCheckpoints
from .replica import ADAPTER_FILES
from .router import Pool, Replica, build_app

log = logging.getLogger("artsdk.ray")

CHECK_TIMEOUT = 10.0  # seconds a replica has to answer a health check before it is drained
# Ray runs its workers at nice 15, so they yield the CPU to every other process on the machine: the
# replicas and ranks are the job's own work, and beside two busy processes (2 cores) a fault test ran 15
# times slower (33 s -> 506 s). The Ray the backend starts runs them at the driver's priority.
RAY_SYSTEM_CONFIG = {"worker_niceness": 0}


class RayBackend:
    """See the module docs. Implements ``artsdk.Backend``."""

    def __init__(self, *, address: Optional[str] = None, replicas: int = 1, trainers: int = 1,
                 replica_cpus: float = 1, replica_gpus: float = 0, replica_resources: Optional[dict[str, float]] = None,
                 trainer_cpus: float = 1, trainer_gpus: float = 0, trainer_resources: Optional[dict[str, float]] = None,
                 placement: str = "PACK", device: str = "auto", dtype: Optional[str] = None, host: str = "127.0.0.1",
                 port: int = 0, api_key: Optional[str] = None, home: Optional[str] = None, cache: Optional[str] = None,
                 keep_checkpoints: int = 3, best_metric: Optional[str] = None, engine: str = "builtin",
                 vllm: Optional[dict[str, Any]] = None, max_batch: int = 64, replica_restarts: int = -1,
                 wait_s: float = 120.0, health_interval_s: float = 1.0, setup_timeout_s: float = 1800.0,
                 shard: str = "none", checkpoints_url: Optional[str] = None, colocate: bool = False,
                 docs: bool = False, **train_defaults: Any) -> None:
        from artsdk.config import settings

        for name, value in (("replicas", replicas), ("trainers", trainers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BackendError(f"ray backend: {name} must be a whole number >= 1, got {value!r}")
        for name, value in (("replica_cpus", replica_cpus), ("trainer_cpus", trainer_cpus),
                            ("replica_gpus", replica_gpus), ("trainer_gpus", trainer_gpus)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise BackendError(f"ray backend: {name} must be a number >= 0, got {value!r}")
        if placement not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise BackendError(f"ray backend: placement {placement!r} is not one of PACK, SPREAD, STRICT_PACK, "
                               f"STRICT_SPREAD")
        if shard not in ("none", "fsdp"):
            raise BackendError(f"ray backend: unknown shard {shard!r}; use \"fsdp\" (the model sharded over the "
                               f"trainer ranks) or \"none\" (each rank holds it whole)")
        if engine not in ("builtin", "vllm"):
            raise BackendError(f"ray backend: unknown engine {engine!r}; use \"builtin\" or \"vllm\"")
        if not isinstance(colocate, bool):
            raise BackendError(f"ray backend: colocate must be true or false, got {colocate!r}")
        if colocate and replicas > trainers:
            raise BackendError(f"ray backend: colocated, each replica shares a trainer rank's bundle, so replicas "
                               f"({replicas}) can be at most trainers ({trainers}); add ranks or set colocate = false")
        self.address, self.replicas, self.trainers = address, replicas, trainers
        self.replica_shape = {"num_cpus": replica_cpus, "num_gpus": replica_gpus, "resources": replica_resources or {}}
        self.trainer_shape = {"CPU": trainer_cpus, "GPU": trainer_gpus, **(trainer_resources or {})}
        self.placement, self.colocate = placement, colocate
        self.home = Path(home or settings().home)
        self.cache = cache or os.environ.get("ARTSDK_CACHE")
        self.host, self.port, self.docs = host, port, docs
        self.api_key = session_key(api_key)  # the router's: a fresh random one unless one is given
        self.keep_checkpoints, self.best_metric = keep_checkpoints, best_metric
        self.replica_options: dict[str, Any] = {"device": device, "dtype": dtype, "engine": engine, "vllm": vllm,
                                                "max_batch": max_batch, "cache": self.cache,
                                                "threads": max(1, int(replica_cpus)) if not replica_gpus else None,
                                                "colocated": colocate, **train_defaults}
        self.shard = shard
        # where steps are committed for another driver to take the run over (a shared folder, s3://...)
        self.checkpoints_url = checkpoints_url
        self.trainer_options: dict[str, Any] = {"device": device, "dtype": dtype, "cache": self.cache, "shard": shard,
                                                "colocated": colocate,
                                                "threads": max(1, int(trainer_cpus)) if not trainer_gpus else None,
                                                "train_defaults": train_defaults}
        if isinstance(setup_timeout_s, bool) or not isinstance(setup_timeout_s, (int, float)) or setup_timeout_s <= 0:
            raise BackendError(f"ray backend: setup_timeout_s must be a number of seconds above 0, got "
                               f"{setup_timeout_s!r}")
        self.replica_restarts, self.wait_s, self.health_interval_s = replica_restarts, wait_s, health_interval_s
        self.setup_timeout_s = float(setup_timeout_s)  # a replica's set-up longer than this: restarted
        self.deployments: dict[str, Deployment] = {}
        self._server: Any = None
        self._started_ray = False
        self._lock = threading.Lock()

    # -- Backend protocol -----------------------------------------------------------------

    async def register(self, model: TrainableModel, *, fresh: bool = False,
                       resume_step: Optional[int] = None) -> Endpoint:
        from backends.local.checkpoints import move_aside

        self._connect()
        moved = None
        if fresh and self.checkpoints_url:
            committed = SharedCheckpoints(self.checkpoints_url, model.project, model.name).steps()
            if committed:
                raise BackendError(f"model {model.name!r} has steps {committed} committed at {self.checkpoints_url}: "
                                   f"a fresh start would mix its steps with them; resume instead, or give another "
                                   f"checkpoints_url, project or model name")
        if fresh:
            await self.unregister(model)
            moved = move_aside(self.home / model.project / model.name / "checkpoints")
        elif resume_step is not None:
            await self.unregister(model)
        d = self.deployments.get(model.name)
        if d is None:
            d = Deployment(self, model, resume_step)
            try:
                await d.start()
            except BaseException:
                await d.stop()
                raise
            self.deployments[model.name] = d
        return Endpoint(base_url=self._ensure_server(), api_key=self.api_key, model=model.name,
                        moved_aside=str(moved) if moved else None)

    async def train(self, model: TrainableModel, groups: Sequence[Group], **config: Any) -> TrainResult:
        d = self._deployment(model)
        step, metrics, path = await d.step_with("train", list(groups), config)
        return TrainResult(step=step, metrics=metrics, checkpoint=path, trained=path is not None,
                           reason=None if path is not None else nothing_to_train(groups, metrics),
                           groups_trained=int(metrics.get("groups_trained", 0)),
                           groups_skipped=int(metrics.get("groups_skipped", 0)))

    async def train_sft(self, model: TrainableModel, trajectories: Sequence[Trajectory], **config: Any) -> TrainResult:
        d = self._deployment(model)
        step, metrics, path = await d.step_with("sft", list(trajectories), config)
        return TrainResult(step=step, metrics=metrics, checkpoint=path)

    async def step(self, model: TrainableModel) -> int:
        d = self.deployments.get(model.name)
        return d.step if d is not None else 0

    def checkpoint_dir(self, model: TrainableModel, step: int) -> Path:
        folder = self.home / model.project / model.name / "checkpoints" / str(step)
        if not (folder / "trainer_state.json").is_file():
            raise BackendError(f"model {model.name!r} has no checkpoint for step {step}")
        return folder

    def checkpoint_steps(self, model: TrainableModel) -> list[int]:
        from backends.local.checkpoints import Checkpoints

        folder = self.home / model.project / model.name / "checkpoints"
        return Checkpoints(folder).steps() if folder.is_dir() else []

    async def endpoint_calls(self, rollout_id: str) -> list[Any]:
        """The calls the replicas answered for the rollout ``rollout_id`` (taken from each: a
        rollout moved to another replica by a failure has calls on both), in the order they
        arrived."""
        from artsdk.trajectory import LLMCall

        replicas = [r for d in self.deployments.values() for r in d.pool.replicas]
        answers = await asyncio.gather(*(r.actor.endpoint_calls.remote(rollout_id) for r in replicas),
                                       return_exceptions=True)
        calls = [LLMCall.model_validate(c) for a in answers if isinstance(a, list) for c in a]
        return sorted(calls, key=lambda c: getattr(c, "at", 0.0))

    async def unregister(self, model: TrainableModel) -> None:
        d = self.deployments.pop(model.name, None)
        if d is not None:
            await d.stop()

    async def close(self) -> None:
        for name in list(self.deployments):
            await self.deployments.pop(name).stop()
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    @property
    def base_url(self) -> Optional[str]:
        return self._server.base_url if self._server is not None else None

    def status(self) -> dict[str, Any]:
        """Each model's step and replicas (ready, steps served, requests in flight, failures)."""
        out = {}
        for name, d in self.deployments.items():
            with d.pool.lock:
                out[name] = {"step": d.step, "routing_step": d.pool.current, "ranks": len(d.ranks),
                             "asleep": d.asleep,
                             "replicas": [{"ready": r.ready, "steps": sorted(r.steps), "inflight": r.inflight, "answered": r.answered,
                                           "failures": r.failures, "incarnation": r.incarnation} for r in d.pool.replicas]}
        return out

    # -- inside ---------------------------------------------------------------------------

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=True)
        else:  # a Ray instance on this machine, with room for every replica and rank asked for ("local":
            # one of its own, not the cluster Ray last recorded as this machine's, which may be gone)
            need = self.replicas * self.replica_shape["num_cpus"] + self.trainers * self.trainer_shape["CPU"]
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(need + 0.999)), include_dashboard=False,
                     log_to_driver=True, _system_config=RAY_SYSTEM_CONFIG)
            self._started_ray = True

    def _deployment(self, model: TrainableModel) -> "Deployment":
        d = self.deployments.get(model.name)
        if d is None:
            raise BackendError(f"model {model.name!r} is not registered with this backend; open a session first")
        return d

    def _pools(self) -> dict[str, Pool]:
        return {name: d.pool for name, d in self.deployments.items()}

    def _ensure_server(self) -> str:
        with self._lock:
            if self._server is None:
                self._server = ServerThread(build_app(self._pools, self.api_key, self.wait_s, docs=self.docs),
                                            self.host, self.port)
            return self._server.base_url


class Deployment:
    """One model on the cluster: its trainer ranks, its replicas and their pool, its
    checkpoints (written here), and the watch that keeps the replicas set up."""

    def __init__(self, backend: RayBackend, spec: TrainableModel, resume_step: Optional[int] = None) -> None:
        from backends.local.checkpoints import Checkpoints

        self.be, self.spec = backend, spec
        self.checkpoints = Checkpoints(backend.home / spec.project / spec.name / "checkpoints")
        self.shared = (SharedCheckpoints(backend.checkpoints_url, spec.project, spec.name)
                       if backend.checkpoints_url else None)
        if self.shared is not None:
            resume_step = self._take_over(resume_step)
        self.step = self.checkpoints.resume_point(resume_step) or 0  # read whole: a corrupt one fails here
        self.pool = Pool(spec.name, spec.base_model, key=secrets.token_urlsafe(24), replicas=[])
        self.pool.release = lambda replica, step: replica.actor.release.remote(step)
        self.ranks: list[Any] = []
        self._placement: Any = None
        self._step_lock = asyncio.Lock()
        self.asleep = False  # colocated: the replicas asleep while the ranks train
        self._stop = threading.Event()
        self._watch: Optional[threading.Thread] = None

    def _take_over(self, resume_step: Optional[int]) -> Optional[int]:
        """The step to resume from when steps are committed at ``checkpoints_url``: the newest
        committed one (or ``resume_step``), fetched here if this driver lacks it. Newer local
        steps, never committed, are set aside by ``resume_point``."""
        assert self.shared is not None
        committed = self.shared.steps()
        if not committed:
            return resume_step
        step = committed[-1] if resume_step is None else resume_step
        if step not in committed:
            raise BackendError(f"step {step} of {self.spec.name!r} is not committed at {self.shared.where} (committed: "
                               f"{committed})")
        if step not in self.checkpoints.steps():
            self.checkpoints.write(step, self.shared.get(step))
        log.info("%s: taking the run over at step %d from %s", self.spec.name, step, self.shared.where)
        return step

    async def start(self) -> None:
        import ray

        if self.step:
            trained_from = self.checkpoints.state(self.step).get("model", {}).get("base_model")
            if trained_from not in (None, self.spec.base_model):
                raise BackendError(f"the checkpoints in {self.checkpoints.folder} were trained from base model "
                                   f"{trained_from!r}, not {self.spec.base_model!r}; give the model another name "
                                   f"(or project), or move that folder away to start over")
        from .replica import Replica as ReplicaActor

        actor = ray.remote(ReplicaActor)
        driver_ip = ray.util.get_node_ip_address()
        shape = self.be.replica_shape
        if self.be.colocate:  # replica i in rank i's bundle, which holds them both
            replica = {"CPU": shape["num_cpus"], "GPU": shape["num_gpus"], **shape["resources"]}
            both = _summed(self._rank_shape(), replica)
            await self._place([both] * self.be.trainers, f"{self.be.trainers} trainer rank(s), each with a replica, "
                                                         f"in bundles of {both}")
        self.pool.replicas = [Replica(i, actor.options(
            num_cpus=shape["num_cpus"], num_gpus=shape["num_gpus"], resources=shape["resources"],
            max_restarts=self.be.replica_restarts, max_task_retries=0,
            scheduling_strategy=self._where(i) if self.be.colocate else "SPREAD",
        ).remote(self.spec.model_dump(), dict(self.be.replica_options), driver_ip, self.pool.key))
            for i in range(self.be.replicas)]
        await self.start_trainers()
        with self.pool.lock:
            self.pool.current = self.step
        await asyncio.gather(*(asyncio.to_thread(self._set_up, r) for r in self.pool.replicas))
        if not self.pool.ready():
            raise BackendError(f"no inference replica of {self.spec.name!r} could be set up (each is given "
                               f"setup_timeout_s={self.be.setup_timeout_s:g}); see the warnings above and the Ray logs")
        self._watch = threading.Thread(target=self._keep_set_up, name=f"artsdk-ray-{self.spec.name}", daemon=True)
        self._watch.start()

    async def start_trainers(self) -> None:
        """The trainer ranks, in one placement group, joined in one process group, at the last
        checkpoint. Colocated, the group is the one the replicas were placed in, and stays."""
        import ray

        from .trainer import TrainerRank

        shape = self._rank_shape()
        if not self.be.colocate:
            await self._place([shape] * self.be.trainers, f"{self.be.trainers} trainer rank(s) of {shape}")
        else:  # the replicas' bundles, placed again by Ray if a node was lost: waited for
            await self._placed(self._placement, f"{self.be.trainers} trainer rank(s) beside the replicas")
        actor = ray.remote(concurrency_groups={"control": 1})(TrainerRank)  # interrupt() runs beside a step
        extra = {k: v for k, v in shape.items() if k not in ("CPU", "GPU")}
        self.ranks = [actor.options(
            num_cpus=shape.get("CPU", 0), num_gpus=shape.get("GPU", 0), resources=extra, max_restarts=0,
            scheduling_strategy=self._where(i),
        ).remote(self.spec.model_dump(), i, self.be.trainers, dict(self.be.trainer_options))
            for i in range(self.be.trainers)]
        try:
            ip, port = await self.ranks[0].address.remote()
            await asyncio.gather(*(r.join.remote(ip, port) for r in self.ranks))
            if self.step:
                files = ray.put(await asyncio.to_thread(self.checkpoints.files, self.step))
                await asyncio.gather(*(r.load.remote(self.step, files) for r in self.ranks))
        except ray.exceptions.RayError as e:
            raise BackendError(f"the trainer ranks of {self.spec.name!r} could not start: {_cause(e)}") from None

    def _rank_shape(self) -> dict[str, float]:
        return {k: v for k, v in self.be.trainer_shape.items() if v}

    async def _place(self, bundles: list[dict[str, float]], what: str) -> None:
        """A new placement group of ``bundles`` (the old one removed), once the cluster has placed it."""
        from ray.util.placement_group import placement_group, remove_placement_group

        if self._placement is not None:
            remove_placement_group(self._placement)
        self._placement = placement_group([dict(b) for b in bundles], strategy=self.be.placement)
        await self._placed(self._placement, what)

    async def _placed(self, group: Any, what: str) -> None:
        import ray

        try:
            await asyncio.wait_for(group.ready(), timeout=self.be.wait_s)
        except asyncio.TimeoutError:
            raise BackendError(f"the cluster could not place {what} ({self.be.placement}) within "
                               f"{self.be.wait_s:.0f}s; its resources: {ray.cluster_resources()}") from None

    def _where(self, i: int) -> Any:
        """Rank ``i``'s bundle of the placement group (where replica ``i`` goes too, colocated)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self._placement, placement_group_bundle_index=i)

    async def step_with(self, kind: str, data: list[Any], config: dict[str, Any]) -> tuple[int, dict[str, float],
                                                                                            Optional[str]]:
        """One step (``kind`` "train" or "sft") on every rank: (step, figures, checkpoint or None)."""
        import ray

        async with self._step_lock:
            if not self.ranks:  # a lost rank found no room when they started again: place them now
                await self.start_trainers()  # BackendError naming what the cluster lacks, until a node has it
            step = self.step + 1
            ref = ray.put(data)
            async with self._taking_turns() as turns:  # colocated: the replicas asleep meanwhile
                t0 = time.perf_counter()
                calls = [asyncio.ensure_future(getattr(r, kind).remote(step, ref, config)) for r in self.ranks]
                try:
                    results = await self._all(calls, step)
                except asyncio.CancelledError:  # Ctrl-C: the ranks stop together and put the weights back
                    await asyncio.shield(self._interrupt(step, calls))
                    raise
                ranks_s = time.perf_counter() - t0
            metrics = {**results[0], "seconds_ranks": ranks_s, **turns}
            if kind == "train" and not metrics.get("tokens_trained"):
                return self.step, metrics, None
            # from here the step completes even if the caller is cancelled: whole, not half
            return await asyncio.shield(self._commit(step, metrics))

    @contextlib.asynccontextmanager
    async def _taking_turns(self) -> AsyncIterator[dict[str, float]]:
        """Colocated: every ready replica sleeps while the ranks work on the devices it shares
        with them (a request that reaches it meanwhile waits there), and wakes after -- also when
        the step fails or is cancelled. Its figures: the replicas asleep, how long falling asleep
        and waking took."""
        figures: dict[str, float] = {}
        if not self.be.colocate:
            yield figures
            return
        t0 = time.perf_counter()
        self.asleep, replicas = True, self.pool.ready()
        try:
            slept = await asyncio.gather(*(r.actor.sleep.remote() for r in replicas), return_exceptions=True)
            for r, result in zip(replicas, slept):
                if isinstance(result, BaseException):  # it answers on, beside the ranks; nothing is lost
                    log.warning("%s: replica %d could not sleep for the step (%s)", self.spec.name, r.index,
                                _cause(result))
            figures.update(replicas_asleep=float(sum(not isinstance(x, BaseException) for x in slept)),
                           seconds_to_sleep=time.perf_counter() - t0)
            yield figures
        finally:
            t1 = time.perf_counter()
            try:
                woke = await asyncio.shield(asyncio.gather(*(r.actor.wake.remote() for r in replicas),
                                                           return_exceptions=True))
            finally:
                self.asleep = False
            with self.pool.lock:
                for r, result in zip(replicas, woke):
                    if isinstance(result, BaseException):  # drained; the health check sets it up again
                        log.warning("%s: replica %d could not wake after the step (%s); drained until it is set "
                                    "up again", self.spec.name, r.index, _cause(result))
                        r.ready = False
            figures["seconds_to_wake"] = time.perf_counter() - t1

    async def _all(self, futures: list[asyncio.Future], step: int) -> list[dict[str, float]]:
        """Every rank's answer; a rank lost (or stuck behind one that failed alone) abandons
        the step and starts the ranks again from the last checkpoint."""
        import ray

        done, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
        if pending:  # one failed: the others get a moment to fail the same way (bad data), or are stuck
            more, pending = await asyncio.wait(pending, timeout=30)
            done |= more
        errors = [f.exception() for f in done if f.exception() is not None]
        if not errors and not pending:
            return [f.result() for f in futures]
        causes = [_cause(e) for e in errors]
        same = not pending and len(errors) == len(futures) and len({type(c) for c in causes}) == 1
        if same and isinstance(causes[0], (ArtError, ValueError)) and not isinstance(errors[0], ray.exceptions.RayActorError):
            # every rank refused the same input before moving anything (train_step puts them back)
            if isinstance(causes[0], ArtError):
                raise causes[0]
            raise BackendError(f"training {self.spec.name!r}: {causes[0]}") from None
        for f in pending:
            f.cancel()
        if self._stop.is_set():  # unregistered meanwhile: its ranks were ended on purpose
            raise self._abandoned()
        failed = [(i, f.exception()) for i, f in enumerate(futures) if f.done() and not f.cancelled()
                  and f.exception() is not None]
        rank, lost = next(((i, e) for i, e in failed if isinstance(e, ray.exceptions.RayActorError)),
                          failed[0] if failed else (None, None))
        why = str(_cause(lost)).strip().splitlines()[0][:300] if lost is not None else "it stopped answering"
        log.warning("%s: trainer rank %s failed during step %d (%s); starting the ranks again from step %d",
                    self.spec.name, rank, step, why, self.step)
        try:
            await self._restart_trainers()
        except BackendError as e:
            raise BackendError(f"trainer rank {rank} of {self.spec.name!r} failed during step {step} ({why}); the "
                               f"step was abandoned -- no checkpoint written, nothing served -- and the ranks could "
                               f"not start again: {e}. Add a node with those resources and train again: the ranks "
                               f"are placed then, from step {self.step}") from None
        raise BackendError(f"trainer rank {rank} of {self.spec.name!r} failed during step {step} ({why}); the step "
                           f"was abandoned -- no checkpoint written, nothing served -- and the ranks started again "
                           f"from step {self.step}: train again to go on")

    async def _restart_trainers(self) -> None:
        await self._end_ranks()
        await self.start_trainers()

    async def _end_ranks(self) -> None:
        """Let each rank that still answers remove its scratch folder, then end them all."""
        import ray

        await asyncio.gather(*(asyncio.wait_for(r.close.remote(), 30) for r in self.ranks), return_exceptions=True)
        for r in self.ranks:
            ray.kill(r, no_restart=True)
        self.ranks = []

    async def _interrupt(self, step: int, calls: list[asyncio.Future]) -> None:
        """Stop ``step`` on every rank (at the end of the mini-batch in hand), wait for the ranks
        to answer, and put back whatever a rank that had already finished moved. Asked again each
        second: a rank that had not yet begun the step when first asked stops once it has."""
        pending = set(calls)
        while pending:
            await self._ask_to_stop(step)
            _, pending = await asyncio.wait(pending, timeout=1.0)
        for f in (f for f in calls if not f.cancelled()):
            f.exception()  # StepInterrupted, by design (and read, so that it is not reported unread)
        await self._rollback()

    async def _ask_to_stop(self, step: int) -> None:
        """Ask every rank to stop ``step`` if it is under way (trainer.py: ``interrupt``)."""
        await asyncio.gather(*(r.interrupt.options(concurrency_group="control").remote(step) for r in self.ranks),
                             return_exceptions=True)  # a rank that is gone: it is ended or started again anyway

    async def _rollback(self) -> None:
        import ray

        try:
            await asyncio.gather(*(r.rollback.remote() for r in self.ranks))
        except ray.exceptions.RayError:
            await self._restart_trainers()

    async def _commit(self, step: int, metrics: dict[str, float]) -> tuple[int, dict[str, float], str]:
        """Write the checkpoint, have every ready replica serve it, move the name to it, and
        let the ranks drop their snapshot."""
        import ray

        t0 = time.perf_counter()
        state = {"metrics": metrics, "model": self.spec.model_dump()}
        asked = self.ranks if self.be.shard == "fsdp" else self.ranks[:1]  # gathering shards: every rank
        files = (await asyncio.gather(*(r.checkpoint.remote(step, state) for r in asked)))[0]
        if self._stop.is_set():
            raise self._abandoned()
        if self.shared is not None:  # committed there first: a step another driver may take over
            try:
                await asyncio.to_thread(self.shared.put, step, files)
            except Exception as e:  # noqa: BLE001 - the storage's own errors, named below
                await self._rollback()
                raise BackendError(f"step {step} of {self.spec.name!r} could not be committed to "
                                   f"{self.shared.where} ({e}); the step was abandoned -- nothing served -- "
                                   f"train again to go on") from None
        path = await asyncio.to_thread(self.checkpoints.write, step, files)
        t1 = time.perf_counter()
        adapter = ray.put({k: v for k, v in files.items() if k in ADAPTER_FILES})
        ready = self.pool.ready()
        loaded = await asyncio.gather(*(r.actor.publish.remote(step, adapter) for r in ready), return_exceptions=True)
        metrics = {**metrics, "seconds_checkpoint": t1 - t0, "seconds_publish": time.perf_counter() - t1,
                   "replicas_serving": float(sum(not isinstance(x, BaseException) for x in loaded))}
        with self.pool.lock:
            for r, result in zip(ready, loaded):
                if isinstance(result, BaseException):  # drained; the watch sets it up again
                    log.warning("%s: replica %d could not load step %d (%s); drained until it does",
                                self.spec.name, r.index, step, _cause(result))
                    r.ready = False
                else:
                    r.steps.update(result)
            self.pool.advance(step)
        await asyncio.gather(*(r.commit.remote(step) for r in self.ranks))
        self.step = step
        await asyncio.to_thread(self._prune)
        return step, metrics, str(path)

    def _prune(self) -> None:
        """Old checkpoints removed here and where they are committed: there the newest
        ``keep_checkpoints`` stay (whichever driver made them), and any step kept here."""
        self.checkpoints.prune(self.be.keep_checkpoints, self.be.best_metric)
        if self.shared is not None:
            committed = self.shared.steps()
            kept = set(self.checkpoints.steps()) | set(committed[-max(self.be.keep_checkpoints, 1):])
            for old in committed:
                if old not in kept:
                    self.shared.remove(old)

    # -- keeping replicas set up ----------------------------------------------------------

    def _set_up(self, r: Replica) -> None:
        """Set a replica up to serve the current step (after a start, a restart or a failed
        load), then let it take traffic. Called from a thread. A set-up longer than
        ``setup_timeout_s`` is given up and the replica restarted (Ray starts it afresh)."""
        import ray

        if self._stop.is_set():  # the model was unregistered meanwhile: its replicas are ended
            return
        step = self.pool.current
        files = self.checkpoints.files(step, ADAPTER_FILES) if step else None
        try:
            info = ray.get(r.actor.setup.remote(step, files), timeout=self.be.setup_timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as e:
            timed_out = isinstance(e, (TimeoutError, ray.exceptions.GetTimeoutError))
            log.warning("%s: replica %d could not be set up (%s)", self.spec.name, r.index,
                        f"not done within setup_timeout_s={self.be.setup_timeout_s:g}; restarting it" if timed_out
                        else _cause(e))
            with self.pool.lock:
                r.ready = False
            if timed_out and not self._stop.is_set():
                ray.kill(r.actor, no_restart=False)
            return
        with self.pool.lock:
            r.url, r.incarnation, r.steps = info["url"], info["incarnation"], set(info["steps"])
            r.ready = self.pool.current in r.steps
        log.info("%s: replica %d ready at %s, serving steps %s", self.spec.name, r.index, r.url, sorted(r.steps))

    def _keep_set_up(self) -> None:
        """Every ``health_interval_s``, all replicas are asked at once how they are: one that
        serves the current step (again) takes traffic; one that does not answer within
        CHECK_TIMEOUT is drained; one that is not whole (restarted, or a step it could not load)
        is set up in a thread of its own, so no set-up holds up the others' checks."""
        import ray

        setting_up: dict[int, threading.Thread] = {}
        while not self._stop.wait(self.be.health_interval_s):
            replicas = [r for r in self.pool.replicas
                        if not (r.index in setting_up and setting_up[r.index].is_alive())]
            asked = [r.actor.info.remote() for r in replicas]
            answered, _ = ray.wait(asked, num_returns=len(asked), timeout=CHECK_TIMEOUT) if asked else ([], [])
            for r, ref in zip(replicas, asked):
                if self._stop.is_set():
                    return
                try:
                    info = ray.get(ref, timeout=0) if ref in answered else None
                except (ray.exceptions.RayError, TimeoutError):
                    info = None
                if info is None:
                    with self.pool.lock:
                        r.ready = False  # restarting, gone, or not answering
                    continue
                with self.pool.lock:
                    whole = info["incarnation"] == r.incarnation and info["url"] and self.pool.current in info["steps"]
                    if whole:  # (steps the router released stay released, whatever the replica still holds)
                        r.steps &= set(info["steps"])
                    r.ready = bool(whole)  # restarted, or without the current step: no traffic until set up
                if not whole:
                    setting_up[r.index] = threading.Thread(target=self._set_up, args=(r,), daemon=True,
                                                           name=f"artsdk-ray-{self.spec.name}-setup-{r.index}")
                    setting_up[r.index].start()

    def _abandoned(self) -> BackendError:
        return BackendError(f"model {self.spec.name!r} was unregistered while this step trained: the step was "
                            f"abandoned and nothing of it was written")

    async def stop(self) -> None:
        """Stop the replicas and ranks. Returns once a step in flight has let go (abandoned, or
        its checkpoint written into this model's folder), so a model registered after this one
        under the same name never receives it."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self._stop.set()
        if self._watch is not None:
            await asyncio.to_thread(self._watch.join, 60)
        for r in self.pool.replicas:
            try:
                await asyncio.wait_for(r.actor.close.remote(), 30)
            except (ray.exceptions.RayError, asyncio.TimeoutError):
                pass
            ray.kill(r.actor, no_restart=True)
        await self._ask_to_stop(self.step + 1)  # a step under way stops, so the ranks can close at once
        await self._end_ranks()
        try:
            await asyncio.wait_for(self._step_lock.acquire(), 120)
            self._step_lock.release()
        except asyncio.TimeoutError:
            log.warning("%s: a step in flight did not let go within 120 s of the model's unregistering", self.spec.name)
        if self._placement is not None:
            remove_placement_group(self._placement)
            self._placement = None


def _summed(*shapes: dict[str, float]) -> dict[str, float]:
    """Resource shapes added up, the empty ones left out (a bundle holding several actors)."""
    total: dict[str, float] = {}
    for shape in shapes:
        for k, v in shape.items():
            total[k] = total.get(k, 0) + v
    return {k: v for k, v in total.items() if v}


def _cause(e: Any) -> Any:
    """The exception a Ray task raised (inside a RayTaskError), or ``e``."""
    import ray

    if isinstance(e, ray.exceptions.RayTaskError) and getattr(e, "cause", None) is not None:
        return e.cause
    return e
