"""The ray backend's one OpenAI-compatible endpoint: requests are passed on to the inference
replicas, as they are, over HTTP.

- **Steps.** A request for ``name`` is pinned here to the newest step every ready replica
  serves (``name@step``), before it leaves; a replica keeps a step until the router has no
  request on it (``release``).
- **One rollout, one replica.** The replica is chosen by a key -- the rollout's id (the
  ``X-Artsdk-Rollout`` header artsdk sends in a session) or else the start of the conversation
  -- and a key stays with its replica while that one is ready, so a rollout's calls meet a warm
  prefix cache; a new key goes to the least busy replica instead of its own when that one has
  far more requests in flight. A Responses API call continuing an earlier response goes where
  that response is.
- **The endpoint's record.** The rollout's id and the client's number for the call go on to
  the replica, whose server keeps its own record of the call (``endpoint_record.py``); a
  per-rollout URL (``/r/<id>/v1/...``) names the rollout the same way.
- **Failures.** A request whose replica cannot be reached, or dies before answering, goes to
  another ready replica; a streamed answer already under way cannot be moved and ends with an
  error. While no replica is ready (all restarting) a request waits, up to ``wait_s``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import zlib
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..endpoint_record import CALL_HEADER, ROLLOUT_HEADER, VIA_HEADER, PerRolloutPaths
from ..http import api_docs, error, guard

MAX_BODY = 32 * 1024 * 1024
SLACK = 8  # requests in flight a replica may have beyond the least busy one before its keys move
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]+)"')


@dataclass
class Replica:
    """What the router knows of one replica."""

    index: int
    actor: Any
    url: Optional[str] = None
    ready: bool = False  # taking traffic: set up, serving the current step
    incarnation: Optional[str] = None
    steps: set[int] = field(default_factory=set)
    inflight: int = 0
    answered: int = 0  # requests it answered
    failures: int = 0  # requests that could not reach it


@dataclass
class Pool:
    """The replicas of one model and the step requests are pinned to."""

    name: str
    base_model: str
    key: str  # the replicas' API key
    replicas: list[Replica]
    current: int = 0
    on_step: Counter = field(default_factory=Counter)  # step -> requests in flight on it
    owners: "OrderedDict[str, int]" = field(default_factory=OrderedDict)  # response id -> replica index
    keys: "OrderedDict[str, int]" = field(default_factory=OrderedDict)  # routing key -> its replica
    recent: "deque[tuple[str, int, int]]" = field(default_factory=lambda: deque(maxlen=4096))  # (key, replica, step)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: Callable[[Replica, int], None] = lambda replica, step: None

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready]

    def choose(self, key: str, step: int, avoid: set[int], owner: Optional[int] = None) -> Optional[Replica]:
        """The replica for ``key`` among the ready ones serving ``step`` (call with ``lock``)."""
        ready = [r for r in self.replicas if r.ready and step in r.steps and r.index not in avoid]
        if not ready:
            return None
        for index in (owner, self.keys.get(key)):  # where its conversation already is
            found = next((r for r in ready if r.index == index), None)
            if found is not None:
                if key in self.keys:
                    self.keys.move_to_end(key)
                return found
        preferred = ready[zlib.crc32(key.encode()) % len(ready)]
        least = min(ready, key=lambda r: r.inflight)
        chosen = least if preferred.inflight > least.inflight + SLACK else preferred
        self.keys[key] = chosen.index
        while len(self.keys) > 100_000:
            self.keys.popitem(last=False)
        return chosen

    def advance(self, step: int) -> None:
        """Requests for the model's name go to ``step`` from now on; older steps no request is on
        are released (call with ``lock``)."""
        old, self.current = self.current, step
        for s in sorted({old, *self.on_step}):
            if s != step and not self.on_step.get(s):
                self._release_everywhere(s)

    def _release_everywhere(self, step: int) -> None:
        self.on_step.pop(step, None)
        for r in self.replicas:
            if step in r.steps and step != 0:
                r.steps.discard(step)
                self.release(r, step)

    def done(self, replica: Replica, step: int, answered: bool) -> None:
        with self.lock:
            replica.inflight -= 1
            replica.answered += answered
            self.on_step[step] -= 1
            if not self.on_step[step] and step != self.current:
                self._release_everywhere(step)

    def remember(self, response_id: str, replica: Replica) -> None:
        with self.lock:
            self.owners[response_id] = replica.index
            while len(self.owners) > 100_000:
                self.owners.popitem(last=False)


def routing_key(body: dict[str, Any], header: Optional[str]) -> str:
    """The rollout's id, or the start of the conversation (its first two messages)."""
    if header:
        return header
    start = body.get("messages") or body.get("input") or body.get("prompt") or ""
    if isinstance(start, list):
        start = start[:2]
    return json.dumps(start, sort_keys=True, default=str)[:4000]


def build_app(pools: Callable[[], dict[str, Pool]], api_key: Optional[str], wait_s: float = 120.0,
              docs: bool = False) -> FastAPI:
    app = FastAPI(title="artsdk ray backend", version="1", **api_docs(docs))
    # the replicas' own apps keep the record and refuse a call to an ended rollout's path
    app.add_middleware(PerRolloutPaths)
    guard(app, api_key, MAX_BODY)  # added last, so it runs first
    clients: dict[int, Any] = {}

    def client() -> Any:
        import httpx

        loop = id(asyncio.get_running_loop())
        if loop not in clients:  # an async client belongs to its event loop
            clients[loop] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                                              limits=httpx.Limits(max_connections=1024))
        return clients[loop]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "replicas": {p.name: f"{len(p.ready())}/{len(p.replicas)} ready"
                                             for p in pools().values()}}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = []
        for name, p in pools().items():
            data.append({"id": name, "object": "model", "owned_by": "artsdk", "root": p.base_model, "step": p.current})
            steps = set().union(*(r.steps for r in p.ready())) if p.ready() else set()
            data += [{"id": f"{name}@{s}", "object": "model", "owned_by": "artsdk", "root": p.base_model, "step": s}
                     for s in sorted(steps)]
        return {"object": "list", "data": data}

    @app.post("/v1/{path:path}")
    async def forward(path: str, request: Request) -> Any:
        where = f"/v1/{path}"  # errors in the shape of its API (Anthropic's for /v1/messages)
        raw = await request.body()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return error(400, f"the request body is not a JSON object ({e})", path=where)
        requested = body.get("model")
        name, at, step_text = str(requested).partition("@")
        pool = pools().get(name) if isinstance(requested, str) else None
        if pool is None:
            known = ", ".join(sorted(pools())) or "none registered"
            return error(400, f"unknown model {str(requested)[:100]!r}; this server has: {known}", "model", path=where)
        if at and not step_text.isdigit():
            return error(400, f"{requested[:100]!r}: {step_text[:20]!r} is not a step number", "model", path=where)
        key = routing_key(body, request.headers.get("x-artsdk-rollout"))
        previous = body.get("previous_response_id")
        avoid: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            with pool.lock:
                step = int(step_text) if at else pool.current
                replica = pool.choose(key, step, avoid, pool.owners.get(previous) if previous else None)
                if replica is not None:
                    replica.inflight += 1
                    pool.on_step[step] += 1
                    pool.recent.append((key[:200], replica.index, step))
            if replica is None:
                if at and all(step not in r.steps for r in pool.ready()) and pool.ready():
                    return error(400, f"{requested[:100]!r}: step {step} is not being served (serving "
                                      f"{sorted(set().union(*(r.steps for r in pool.ready())))}); ask for "
                                      f"{name!r} for the newest", "model", path=where)
                if time.monotonic() > deadline or await request.is_disconnected():
                    return error(503, f"no inference replica of {name!r} is ready ({len(pool.ready())} of "
                                      f"{len(pool.replicas)}); try again shortly", kind="server_error", path=where)
                avoid.clear()  # every replica was tried: wait for one to come back, then try again
                await asyncio.sleep(0.2)
                continue
            body["model"] = f"{name}@{step}"
            answer = await _send(client(), replica, path, body, request, pool, step)
            if answer is not None:
                return answer
            avoid.add(replica.index)  # it could not answer: another replica

    return app


async def _send(http: Any, replica: Replica, path: str, body: dict[str, Any], request: Request, pool: Pool,
                step: int) -> Optional[Response]:
    """The replica's answer, passed on; None when the replica could not give one (then it is
    drained until the health check sees it whole again)."""
    import httpx

    headers = {"authorization": f"Bearer {pool.key}", "content-type": "application/json",
               **{k: request.headers[k] for k in (ROLLOUT_HEADER, CALL_HEADER, VIA_HEADER) if k in request.headers}}
    req = http.build_request("POST", f"{replica.url}/{path}", headers=headers, content=json.dumps(body).encode())
    finished = False
    try:
        resp = await http.send(req, stream=True)
        if resp.headers.get("content-type", "").startswith("text/event-stream") and resp.status_code == 200:
            finished = True  # the stream's own end releases it

            async def relay() -> Any:
                seen = b""
                try:
                    async for chunk in resp.aiter_raw():
                        if len(seen) < 8192:
                            seen += chunk
                            m = _RESPONSE_ID.search(seen)
                            if m:
                                pool.remember(m.group(1).decode(), replica)
                                seen = b"x" * 8192
                        yield chunk
                finally:
                    await resp.aclose()
                    pool.done(replica, step, True)

            return StreamingResponse(relay(), status_code=resp.status_code, headers=_passed(resp.headers))
        content = await resp.aread()
        await resp.aclose()
    except (httpx.TransportError, httpx.StreamError):
        with pool.lock:
            replica.ready = False
            replica.failures += 1
        return None
    finally:
        if not finished:
            pool.done(replica, step, answered=False)
    with pool.lock:
        replica.answered += 1
    if resp.status_code == 200 and path.startswith("responses"):
        m = _RESPONSE_ID.search(content[:8192])
        if m:
            pool.remember(m.group(1).decode(), replica)
    return Response(content, status_code=resp.status_code, headers=_passed(resp.headers))


def _passed(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}
