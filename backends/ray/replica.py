"""An inference replica: a Ray actor running the local backend's engine and OpenAI-compatible
server for one model, on a machine of the cluster. It serves the steps the router publishes to
it (the adapter's files arrive as bytes: no shared filesystem is needed) and keeps each one
until the router releases it, since the router pins requests to steps before they get here.

Colocated with a trainer rank (``colocate = true``), it sleeps while the rank trains on the
devices they share, and wakes after (``sleep``, ``wake``).

A replica restarted by Ray (its node lost) comes back empty, with a new ``incarnation``: the
backend sets it up again -- the server, the current adapter -- before sending it traffic.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
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
        # while asleep (or falling asleep): the thread holding the engine, its alarm, its errors, and once asleep
        self._rest: Optional[tuple[threading.Thread, threading.Event, list, threading.Event]] = None

    def info(self) -> dict[str, Any]:
        """Who this is and what it serves (the backend's health check)."""
        import ray

        served = self._served()
        return {"incarnation": self.incarnation, "url": self.url, "pid": os.getpid(), "node": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "asleep": self._asleep(),
                "step": served.step if served else None, "steps": sorted(served.serving) if served else [],
                "checkpoints": str(served.checkpoints.folder) if served else None}

    async def setup(self, step: int, files: Optional[dict[str, bytes]]) -> dict[str, Any]:
        """Load the model and start the server (once), and serve ``step`` from its adapter
        ``files`` (step 0: the base model). Returns ``info()``."""
        if self.backend is None:
            from backends.local import LocalBackend

            threads = self.options.pop("threads", None)
            if self.options.pop("colocated", False):
                self.options["vllm"] = _sharing(self.options)
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

    async def sleep(self) -> None:
        """Leave this bundle's devices to the trainer rank beside it until ``wake``: vLLM lets
        the requests in flight finish, then sleeps (its weights offloaded, its cache dropped);
        the built-in engine stops between two tokens. Requests that reach it meanwhile wait."""
        import anyio

        served = self._served()
        if served is None or self._rest is not None:
            return
        entered, alarm, failed = threading.Event(), threading.Event(), []

        def rest() -> None:  # one thread enters and leaves: the built-in engine's lock is its owner's
            try:
                with served.engine.training():
                    entered.set()
                    alarm.wait()
            except BaseException as e:  # noqa: BLE001 - raised by sleep(), or by wake()
                failed.append(e)
            finally:
                entered.set()

        thread = threading.Thread(target=rest, name="artsdk-replica-asleep", daemon=True)
        self._rest = (thread, alarm, failed, entered)  # set first: a wake() meanwhile (a step cancelled) counts
        thread.start()
        await anyio.to_thread.run_sync(entered.wait)
        if failed and self._rest is not None and self._rest[0] is thread:  # it could not sleep
            self._rest = None
            raise failed[0]

    def _asleep(self) -> bool:
        return self._rest is not None and self._rest[3].is_set() and not self._rest[2]

    async def wake(self) -> None:
        """Take the devices back (vLLM wakes) and answer again."""
        import anyio

        if self._rest is None:
            return
        thread, alarm, failed, _ = self._rest
        alarm.set()
        await anyio.to_thread.run_sync(thread.join)
        self._rest = None
        if failed:  # vLLM could not wake: its server is ended, and the health check sets it up anew
            backend, self.backend, self.url = self.backend, None, None
            await backend.close()
            raise failed[0]

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
        await self.wake()
        if self.backend is not None:
            await self.backend.close()
            self.backend = None
        shutil.rmtree(self.home, ignore_errors=True)


def _sharing(options: dict[str, Any]) -> Optional[dict[str, Any]]:
    """vLLM's options for a replica sharing its GPU with a trainer rank: it sleeps while the
    rank trains, and takes half the GPU unless told otherwise (as the local backend's vLLM does
    beside its trainer). On CPUs vLLM has no sleep mode: the options stay as given."""
    import torch

    vllm, device = options.get("vllm"), options.get("device") or "auto"
    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if options.get("engine") != "vllm" or not on_gpu:
        return vllm
    return {"sleep": True, "gpu_memory_utilization": 0.5, **(vllm or {})}
