"""``RemoteBackend``: the Backend protocol over HTTP, talking to ``artsdk serve``.

```toml
backend = "remote"
backend_url = "http://gpu-box:7999"      # or ARTSDK_BACKEND_URL
api_key = "..."                          # or ARTSDK_API_KEY
```

Idempotent calls are retried with backoff when the connection fails. A training step is
submitted with a request id made here, so re-sending it after a dropped connection returns
the step that already ran rather than training twice. If the server stays away, the error
says so; the trajectories are still in the local store, ready to be trained on later.
"""

from __future__ import annotations

import json
import logging
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import anyio
import httpx

from artsdk.backend import Endpoint, TrainableModel, TrainResult
from artsdk.errors import BackendError
from artsdk.trajectory import Group, LLMCall, Trajectory

log = logging.getLogger("artsdk.remote")
_RETRYABLE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
              httpx.ConnectTimeout, httpx.ReadTimeout, httpx.PoolTimeout)


class RemoteBackend:
    """See the module docs. Implements ``artsdk.Backend``."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, retries: int = 5,
                 backoff: float = 0.5, timeout: float = 60.0, train_timeout: float = 3600.0) -> None:
        if not url:
            raise BackendError("the remote backend needs the server's URL: set backend_url in artsdk.toml "
                               "or ARTSDK_BACKEND_URL (e.g. http://127.0.0.1:7999)")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.retries, self.backoff = retries, backoff
        self.train_timeout = train_timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)

    # -- plumbing -------------------------------------------------------------------------

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One call, retried on connection failures (only for idempotent use)."""
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                r = await self._http.request(method, path, **kw)
            except _RETRYABLE as e:
                if attempt == self.retries:
                    raise BackendError(f"cannot reach artsdk serve at {self.url} ({type(e).__name__}: {e}); "
                                       f"is it running?") from None
                await anyio.sleep(delay)
                delay = min(delay * 2, 10)
                continue
            return self._check(r)
        raise AssertionError("unreachable")

    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code == 401:
            raise BackendError(f"artsdk serve at {self.url} refused the API key (401); set api_key / ARTSDK_API_KEY")
        if r.status_code >= 400:
            try:
                body = r.json()
                detail = body.get("detail") or body.get("error", {}).get("message") or body
            except ValueError:
                detail = r.text[:300]
            raise BackendError(f"artsdk serve at {self.url}: {r.request.method} {r.request.url.path} "
                               f"failed with {r.status_code}: {detail}")
        return r

    # -- Backend protocol -----------------------------------------------------------------

    async def register(self, model: TrainableModel, *, fresh: bool = False,
                       resume_step: Optional[int] = None) -> Endpoint:
        r = await self._request("POST", "/v1/art/models", json={
            "name": model.name, "base_model": model.base_model, "project": model.project,
            "config": model.config, "fresh": fresh,
            **({"resume_step": resume_step} if resume_step is not None else {})})
        return Endpoint(base_url=f"{self.url}/v1", api_key=self.api_key or "artsdk", model=model.name,
                        moved_aside=r.json().get("moved_aside"))

    async def endpoint_calls(self, rollout_id: str) -> list[LLMCall]:
        """The calls the server answered for the rollout ``rollout_id`` (taken)."""
        r = await self._request("POST", f"/v1/art/rollouts/{rollout_id}/calls")
        return [LLMCall.model_validate(c) for c in r.json()["calls"]]

    async def step(self, model: TrainableModel) -> int:
        r = await self._request("GET", f"/v1/art/models/{model.name}")
        return int(r.json()["step"])

    async def train(self, model: TrainableModel, groups: Sequence[Group], **config: Any) -> TrainResult:
        return await self._step(model, "train", {"groups": [json.loads(g.model_dump_json(fallback=repr))
                                                            for g in groups]}, config)

    async def train_sft(self, model: TrainableModel, trajectories: Sequence[Trajectory], **config: Any) -> TrainResult:
        return await self._step(model, "sft", {"trajectories": [json.loads(t.model_dump_json(fallback=repr))
                                                                for t in trajectories]}, config)

    async def _step(self, model: TrainableModel, route: str, data: dict[str, Any],
                    config: dict[str, Any]) -> TrainResult:
        request_id = uuid.uuid4().hex
        body = json.dumps({"request_id": request_id, "config": config, **data})
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return await self._submit(model, body, request_id, route)
            except _RETRYABLE as e:
                # the same request id: if the step already ran, the server answers with it
                if attempt == self.retries:
                    raise BackendError(
                        f"artsdk serve at {self.url} went away during training step {request_id} of "
                        f"{model.name!r} ({type(e).__name__}); the trajectories are in the local store, "
                        f"train on them again when the server is back") from None
                log.warning("training connection lost (%s); retrying request %s", type(e).__name__, request_id)
                await anyio.sleep(delay)
                delay = min(delay * 2, 10)
        raise AssertionError("unreachable")

    async def _submit(self, model: TrainableModel, body: str, request_id: str, route: str = "train") -> TrainResult:
        async with self._http.stream("POST", f"/v1/art/models/{model.name}/{route}", content=body,
                                     headers={"content-type": "application/json"},
                                     timeout=httpx.Timeout(self.train_timeout, connect=10)) as r:
            if r.status_code >= 400:
                await r.aread()
                self._check(r)
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["event"] == "error":
                    raise BackendError(f"training {model.name!r} failed on the server: {event['message']}")
                if event["event"] == "done":
                    keep = {k: v for k, v in event.items() if k not in ("event", "replayed", "request_id", "seconds")}
                    return TrainResult(**keep)
        raise httpx.RemoteProtocolError(f"the server closed the stream of request {request_id} before it ended")

    async def close(self) -> None:
        await self._http.aclose()

    # -- checkpoints ----------------------------------------------------------------------

    async def checkpoints(self, model: TrainableModel) -> list[int]:
        r = await self._request("GET", f"/v1/art/models/{model.name}/checkpoints")
        return list(r.json()["steps"])

    async def pull_checkpoint(self, model: TrainableModel, step: int, dest: str | Path) -> Path:
        """Download one checkpoint (adapter + state) into ``dest/<step>/``."""
        r = await self._request("GET", f"/v1/art/models/{model.name}/checkpoints/{step}")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        import io

        with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")
        return dest / str(step)

    async def delete_model(self, model: TrainableModel) -> None:
        await self._request("DELETE", f"/v1/art/models/{model.name}")

    async def health(self) -> dict[str, Any]:
        t0 = time.monotonic()
        r = await self._request("GET", "/health")
        return {**r.json(), "latency": time.monotonic() - t0}
