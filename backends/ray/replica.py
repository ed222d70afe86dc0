"""An inference replica: a Ray actor running the local backend's engine and OpenAI-compatible
server for one model, on a machine of the cluster. It serves the steps the router publishes to
it (the adapter's files arrive as bytes: no shared filesystem is needed) and keeps each one
until the router releases it, since the router pins requests to steps before they get here.

A replica restarted by Ray (its node lost) comes back empty, with a new ``incarnation``: the
backend sets it up again -- the server, the current adapter -- before sending it traffic.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any, Optional

from artsdk.backend import TrainableModel

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json", "trainer_state.json")


def reachable_host(driver_ip: str) -> str:
    """The address to serve on: loopback when this node is the driver's machine, else the
    node's own address (the router then reaches it with the replica's key)."""
    import ray

    ip = ray.util.get_node_ip_address()
    return "127.0.0.1" if ip == driver_ip or ip.startswith("127.") else ip


class Replica:
    """One inference replica (wrapped with ``ray.remote`` by the backend)."""

    def __init__(self, spec: dict[str, Any], options: dict[str, Any], driver_ip: str, key: str) -> None:
        self.incarnation = uuid.uuid4().hex  # a restart makes a new one
        self.spec = TrainableModel(**spec)
        self.options, self.driver_ip, self.key = options, driver_ip, key
        self.home = Path(tempfile.mkdtemp(prefix="artsdk-replica-"))
        self.backend: Any = None
        self.url: Optional[str] = None

    def info(self) -> dict[str, Any]:
        """Who this is and what it serves (the backend's health check)."""
        served = self._served()
        return {"incarnation": self.incarnation, "url": self.url, "pid": os.getpid(), "node": socket.gethostname(),
                "step": served.step if served else None, "steps": sorted(served.serving) if served else [],
                "checkpoints": str(served.checkpoints.folder) if served else None}

    async def setup(self, step: int, files: Optional[dict[str, bytes]]) -> dict[str, Any]:
        """Load the model and start the server (once), and serve ``step`` from its adapter
        ``files`` (step 0: the base model). Returns ``info()``."""
        if self.backend is None:
            from backends.local import LocalBackend

            threads = self.options.pop("threads", None)
            # on vLLM the replica holds no trainable copy: vLLM's process has the weights, adapters come as files
            self.backend = LocalBackend(host=reachable_host(self.driver_ip), port=0, api_key=self.key,
                                        home=str(self.home), keep_checkpoints=2, threads=threads,
                                        serve_only=self.options.get("engine") == "vllm", **self.options)
            endpoint = await self.backend.register(self.spec)
            self.url = endpoint.base_url
            self._served().hold_steps = True
        if step and step not in self._served().serving:
            await self.publish(step, files)
        return self.info()

    async def publish(self, step: int, files: Optional[dict[str, bytes]]) -> list[int]:
        """Serve ``step`` (and make it the newest) from its adapter files; older steps stay
        served until released. Returns the steps served."""
        import anyio

        served = self._served()
        if files is None:
            raise ValueError(f"step {step} needs its adapter's files")
        await anyio.to_thread.run_sync(self._load, step, files)
        return sorted(served.serving)

    def _load(self, step: int, files: dict[str, bytes]) -> None:
        """Serve ``step`` without stopping: the built-in engine copies its adapter into a free
        serving adapter between two tokens of the batch it decodes; vLLM loads it from the
        files while it answers. The replica's own trainable adapter is never touched."""
        from safetensors.torch import load

        served = self._served()
        folder = served.checkpoints.write(step, files)
        served._publish(step, folder, load(files["adapter_model.safetensors"]))
        served._advance(step)

    def release(self, step: int) -> list[int]:
        """No request of the router's is on ``step`` any more: retire it when nothing pins it."""
        served = self._served()
        served.release(step)
        for old in served.checkpoints.steps():  # the files were needed to load the adapter, not since
            if old not in served.serving:
                served.checkpoints.remove(old)
        return sorted(served.serving)

    async def endpoint_calls(self, rollout_id: str) -> list[dict[str, Any]]:
        """The calls this replica's server answered for a rollout (taken), as JSON."""
        import json

        if self.backend is None:
            return []
        return [json.loads(c.model_dump_json(fallback=repr)) for c in await self.backend.endpoint_calls(rollout_id)]

    def _served(self) -> Any:
        return self.backend.models.get(self.spec.name) if self.backend is not None else None

    async def close(self) -> None:
        """Stop the server and remove this replica's folder (its copies of the adapters)."""
        if self.backend is not None:
            await self.backend.close()
            self.backend = None
        shutil.rmtree(self.home, ignore_errors=True)
