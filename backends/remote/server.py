"""``artsdk serve``: any backend behind a versioned HTTP API, so agent code on one machine
can train on another.

API (v1; the OpenAPI spec is at ``/openapi.json``, docs at ``/docs``):

    GET    /health                                  liveness and version (no key needed)
    POST   /v1/art/models                           register a model (base model, LoRA config)
    GET    /v1/art/models/{name}                    its newest step
    DELETE /v1/art/models/{name}                    stop serving it (checkpoints stay on disk)
    POST   /v1/art/models/{name}/train              one training step; progress streamed as NDJSON
    POST   /v1/art/models/{name}/sft                one supervised step on trajectories' answers, as /train
    POST   /v1/art/rollouts/{id}/calls              the calls the endpoint answered for a rollout (taken)
    GET    /v1/art/models/{name}/checkpoints        steps on disk
    GET    /v1/art/models/{name}/checkpoints/{step} the checkpoint as a .tar.gz
    DELETE /v1/art/models/{name}/checkpoints/{step}
    POST   /v1/chat/completions, /v1/responses,     OpenAI-compatible inference (local backend),
           /v1/messages, GET /v1/models             and Anthropic's Messages API

With an API key every route but ``/health`` needs ``Authorization: Bearer <key>``. A training
submission carries a client-made ``request_id``: sending it again (after a dropped
connection) returns the first result instead of training twice. Steps of one model run one
after another, never interleaved.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import re
import tarfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, HTTPException, Path as PathParam, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from artsdk._version import __version__
from artsdk.backend import TrainableModel
from artsdk.errors import ArtError, ModelLoadError
from artsdk.trajectory import Group, Trajectory

from ..http import KEEP_ALIVE, GuardedH11, error, guard

log = logging.getLogger("artsdk.serve")
API_VERSION = "1"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME = re.compile(NAME)
STEP = r"^[0-9]{1,9}$"  # a checkpoint step: digits only (not "1.0"), and short enough to be a folder name
MAX_BODY = 256 * 1024 * 1024
MAX_CONFIG = 64 * 1024
MAX_GROUPS = 10_000  # in one training step (a body is bounded in groups and trajectories before it is expanded)
MAX_TRAJECTORIES = 100_000


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME)
    base_model: str = Field(min_length=1, max_length=1024)
    project: str = Field("default", pattern=NAME)
    config: dict[str, Any] = Field(default_factory=dict)
    fresh: bool = False  # from the base model: the model's earlier checkpoints are moved aside
    resume_step: Optional[int] = Field(None, ge=0, le=999_999_999)  # from this step, the later ones moved aside

    @field_validator("config")
    @classmethod
    def _small(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(v, default=str)) > MAX_CONFIG:  # it is kept in the registry file
            raise ValueError(f"config is over {MAX_CONFIG} bytes as JSON")
        return v


class TrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=r"^[A-Za-z0-9_-]{8,64}$")
    groups: list[Group] = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("groups", mode="before")
    @classmethod
    def _few_enough(cls, v: Any) -> Any:
        # counted on the parsed JSON, before a Group or Trajectory is built from any of it
        if isinstance(v, list):
            if len(v) > MAX_GROUPS:
                raise ValueError(f"{len(v)} groups in one step; at most {MAX_GROUPS}: split the batch")
            n = sum(len(g["trajectories"]) for g in v if isinstance(g, dict) and isinstance(g.get("trajectories"), list))
            if n > MAX_TRAJECTORIES:
                raise ValueError(f"{n} trajectories in one step; at most {MAX_TRAJECTORIES}: split the batch")
        return v


class SFTRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=r"^[A-Za-z0-9_-]{8,64}$")
    trajectories: list[Trajectory] = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("trajectories", mode="before")
    @classmethod
    def _few_enough(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_TRAJECTORIES:
            raise ValueError(f"{len(v)} trajectories in one step; at most {MAX_TRAJECTORIES}: split them")
        return v


class Registry:
    """Models registered with this server, remembered on disk so a restarted server
    serves them again (lazily, on first use) from their checkpoints."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "models.json"
        folder.mkdir(parents=True, exist_ok=True)
        self.models: dict[str, TrainableModel] = {}
        if self.path.is_file():
            for name, spec in json.loads(self.path.read_text()).items():
                self.models[name] = TrainableModel(**spec)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: m.model_dump() for n, m in self.models.items()}, indent=2))
        tmp.replace(self.path)


class Trainings:
    """Results of training submissions by model and request id (also on disk), so a retried
    submission gets the first answer instead of a second step. Scoped by model: the same id
    sent to another model is another submission; a model deleted or registered fresh forgets
    its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder / "trainings"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.running: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}

    def done(self, model: str, request_id: str) -> Optional[dict[str, Any]]:
        p = self.folder / model / f"{request_id}.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def finish(self, model: str, request_id: str, result: dict[str, Any]) -> None:
        folder = self.folder / model
        folder.mkdir(exist_ok=True)
        tmp = folder / f"{request_id}.tmp"
        tmp.write_text(event(result))
        tmp.replace(folder / f"{request_id}.json")

    def forget(self, model: str) -> None:
        import shutil

        shutil.rmtree(self.folder / model, ignore_errors=True)


def build_app(backend: Any, backend_name: str, home: Path, api_key: Optional[str] = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # closed here, in uvicorn's shutdown: after it, uvicorn re-raises the SIGTERM it
        # caught, so code after uvicorn.run() may never run (and a vLLM engine process
        # would outlive the server)
        await backend.close()

    app = FastAPI(title="artsdk serve", version=API_VERSION, lifespan=lifespan,
                  description="Training backend API of artsdk (see backends/remote/server.py).")
    registry = Registry(home / "serve")
    trainings = Trainings(home / "serve")
    loaded: set[str] = set()
    locks: dict[str, asyncio.Lock] = {}
    app.state.backend = backend

    guard(app, api_key, MAX_BODY)

    @app.exception_handler(ArtError)
    async def art_error(_: Request, exc: ArtError) -> JSONResponse:
        return error(400, str(exc), kind=type(exc).__name__)

    async def model_for(name: str) -> TrainableModel:
        if not _NAME.match(name):
            raise HTTPException(422, f"invalid model name {name!r}")
        spec = registry.models.get(name)
        if spec is None:
            raise HTTPException(404, f"no model {name!r} is registered; POST /v1/art/models first")
        if name not in loaded:  # a restarted server loads it again on first use
            await backend.register(spec)
            loaded.add(name)
        return spec

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__, "api": API_VERSION, "backend": backend_name}

    @app.post("/v1/art/models")
    async def register(body: RegisterRequest) -> dict[str, Any]:
        spec = TrainableModel(body.name, base_model=body.base_model, project=body.project, config=body.config)
        old = registry.models.get(body.name)
        if old is not None and old.base_model != spec.base_model:
            raise HTTPException(409, f"model {body.name!r} is registered with base model {old.base_model!r}")
        try:
            endpoint = await (backend.register(spec, fresh=body.fresh) if body.resume_step is None else
                              backend.register(spec, fresh=body.fresh, resume_step=body.resume_step))
        except ModelLoadError as e:  # the details name files on this machine: they stay in its log
            log.warning("register %r: %s", body.name, e)
            raise HTTPException(400, f"base model {body.base_model!r} cannot be loaded on this server; give a "
                                     f"Hub id it has (or can download), or a model folder on the server") from None
        if body.fresh or body.resume_step is not None:
            trainings.forget(body.name)
        loaded.add(body.name)
        registry.models[body.name] = spec
        registry.save()
        return {"name": body.name, "step": await backend.step(spec), "moved_aside": endpoint.moved_aside}

    @app.get("/v1/art/models/{name}")
    async def get_model(name: str) -> dict[str, Any]:
        spec = await model_for(name)
        return {**spec.model_dump(), "step": await backend.step(spec)}

    @app.delete("/v1/art/models/{name}")
    async def delete_model(name: str) -> dict[str, Any]:
        spec = await model_for(name)
        await backend.unregister(spec)
        loaded.discard(name)
        registry.models.pop(name, None)
        registry.save()
        trainings.forget(name)
        return {"deleted": name}

    @app.post("/v1/art/models/{name}/train")
    async def train(name: str, body: TrainRequest) -> StreamingResponse:
        spec = await model_for(name)
        return _start(spec, body.request_id, lambda: backend.train(spec, body.groups, **body.config))

    @app.post("/v1/art/models/{name}/sft")
    async def train_sft(name: str, body: SFTRequest) -> StreamingResponse:
        """A supervised step on the trajectories' answers, submitted and streamed as a training step."""
        spec = await model_for(name)
        return _start(spec, body.request_id, lambda: backend.train_sft(spec, body.trajectories, **body.config))

    def _start(spec: TrainableModel, rid: str, work: Any) -> StreamingResponse:
        # the step starts here, before any byte is streamed: a client that hangs up at once
        # (a dropped connection) still gets it done, and its retry gets the result
        key = (spec.name, rid)
        previous = trainings.done(*key)
        retried = previous is not None or key in trainings.running
        if not retried:
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            trainings.running[key] = future
            task = asyncio.create_task(_train(spec, rid, work))

            def settled(t: "asyncio.Task[dict[str, Any]]") -> None:
                _settle(future, t)
                trainings.running.pop(key, None)  # only now: a retry until here must wait, not retrain

            task.add_done_callback(settled)
        return StreamingResponse(_train_events(spec.name, rid, previous, retried),
                                 media_type="application/x-ndjson")

    async def _train_events(name: str, rid: str, previous: Optional[dict[str, Any]],
                            retried: bool) -> AsyncIterator[str]:
        try:
            if previous is not None:
                yield event({"event": "done", "replayed": True, **previous}) + "\n"
                return
            running = trainings.running.get((name, rid))
            if running is None:  # finished between the request and this stream
                yield event({"event": "done", "replayed": True, **(trainings.done(name, rid) or {})}) + "\n"
                return
            lock = locks.setdefault(name, asyncio.Lock())
            yield event({"event": "waiting" if retried else "queued", "request_id": rid,
                              "waiting": lock.locked()}) + "\n"
            while not running.done():  # keep the connection alive while the step runs
                await asyncio.wait({running}, timeout=5)
                if not running.done():
                    yield event({"event": "running", "request_id": rid}) + "\n"
            yield event({"event": "done", "replayed": retried, **running.result()}) + "\n"
        except Exception as e:  # noqa: BLE001 - the stream is open: report in-band
            yield event({"event": "error", "message": str(e), "type": type(e).__name__}) + "\n"

    async def _train(spec: TrainableModel, rid: str, work: Any) -> dict[str, Any]:
        # the step goes on even if the client disconnects: its result is kept for a retry
        async with locks.setdefault(spec.name, asyncio.Lock()):
            t0 = time.monotonic()
            result = await work()
            out = {**result.model_dump(), "request_id": rid, "seconds": time.monotonic() - t0}
            trainings.finish(spec.name, rid, out)
            return out

    @app.post("/v1/art/rollouts/{rollout}/calls")
    async def rollout_calls(rollout: str = PathParam(pattern=r"^[A-Za-z0-9_-]{1,64}$")) -> dict[str, Any]:
        """The calls the endpoint answered for a rollout, taken: the rollout's client reconciles
        them with its own record when the rollout ends (artsdk/rollout/reconcile.py)."""
        take = getattr(backend, "endpoint_calls", None)
        calls = await take(rollout) if take is not None else []
        return {"rollout": rollout, "calls": [json.loads(c.model_dump_json(fallback=repr)) for c in calls]}

    @app.get("/v1/art/models/{name}/checkpoints")
    async def checkpoints(name: str) -> dict[str, Any]:
        spec = await model_for(name)
        return {"name": name, "steps": backend.checkpoint_steps(spec)}

    @app.get("/v1/art/models/{name}/checkpoints/{step}")
    async def download(name: str, step: str = PathParam(pattern=STEP)) -> Response:
        spec = await model_for(name)
        folder = backend.checkpoint_dir(spec, int(step))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for f in sorted(folder.iterdir()):
                if f.name != "optimizer.pt":  # the adapter and its state, not the optimizer
                    tar.add(f, arcname=f"{step}/{f.name}")
        return Response(buf.getvalue(), media_type="application/gzip",
                        headers={"content-disposition": f'attachment; filename="{name}-{step}.tar.gz"'})

    @app.delete("/v1/art/models/{name}/checkpoints/{step}")
    async def delete_checkpoint(name: str, step: str = PathParam(pattern=STEP)) -> dict[str, Any]:
        import shutil

        spec = await model_for(name)
        if int(step) == await backend.step(spec):
            raise HTTPException(409, f"step {step} is the newest checkpoint of {name!r}; it is in use")
        shutil.rmtree(backend.checkpoint_dir(spec, int(step)))
        return {"deleted": int(step)}

    if hasattr(backend, "app"):  # the backend's own OpenAI-compatible routes, same port
        inner = backend.app()
        app.mount("/", inner)
        _publish_spec(app, inner)
    return app


def event(data: dict[str, Any]) -> str:
    """One line of strict JSON: a figure that is not finite (a mean of no rewards) is null,
    which ``TrainResult`` reads back as NaN."""
    return json.dumps(_finite(data), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _publish_spec(app: FastAPI, inner: FastAPI) -> None:
    """Serve one OpenAPI spec with both APIs: a mounted app's routes are not in the
    parent's spec by themselves."""
    own = app.openapi

    def merged() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec, extra = own(), inner.openapi()
            for path, ops in extra.get("paths", {}).items():
                if path != "/health":
                    spec["paths"].setdefault(path, ops)
            spec.setdefault("components", {}).setdefault("schemas", {}).update(
                extra.get("components", {}).get("schemas", {}))
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = merged  # type: ignore[method-assign]


def _settle(future: "asyncio.Future[dict[str, Any]]", task: "asyncio.Task[dict[str, Any]]") -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        future.set_result(task.result())


def serve(backend_name: str = "local", host: str = "127.0.0.1", port: int = 7999,
          api_key: Optional[str] = None, home: Optional[str] = None, **options: Any) -> None:
    """Run the server until interrupted (``artsdk serve``)."""
    import uvicorn

    from artsdk.backend import load_backend
    from artsdk.config import settings

    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("artsdk serve is listening on %s without an API key: anyone who can reach "
                    "it can train and query models. Pass --api-key or set ARTSDK_API_KEY.", host)
    home_dir = Path(home or settings().home).expanduser().resolve()
    if backend_name == "local":
        options.setdefault("http", False)  # its inference routes are mounted here instead
        options.setdefault("api_key", api_key)
        options.setdefault("home", str(home_dir))  # checkpoints live under --home, whatever the working folder
    backend = load_backend(backend_name, **options)
    app = build_app(backend, backend_name, home_dir, api_key)
    print(f"artsdk serve: {backend_name} backend on http://{host}:{port} (API v{API_VERSION})", flush=True)
    # on SIGTERM / Ctrl-C uvicorn stops taking requests and lets running ones finish (up to
    # 30 s); a training step cut short leaves no checkpoint behind (they are written atomically)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30, http=GuardedH11,
                timeout_keep_alive=KEEP_ALIVE)
