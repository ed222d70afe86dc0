"""vLLM as the local backend's inference engine, in a process of its own.

    [backend_options]
    engine = "vllm"
    vllm = { gpus = "0", gpu_memory_utilization = 0.5 }   # every option: VLLMOptions

The backend starts vLLM's OpenAI-compatible server on 127.0.0.1 (a free port, a random key)
with the base model and LoRA enabled, logs it to ``<home>/<project>/<model>/vllm.log``, and
stops it on close. Our own server still renders the chat template and parses tool calls, as
with the built-in engine; vLLM only samples. Each request sends the prompt's token ids to
``/v1/completions`` and reads back, streamed, every sampled token id and its logprob -- the
logprob of the tempered distribution it sampled from (``--logprobs-mode
processed_logprobs``; with top_p < 1, of the truncated one), which is what the trainer
recomputes. The decoded text, stop strings and streaming go through ``engine.append``, as
in the built-in engine, so answers read the same whichever engine sampled them.

Adapters: a trained step is copied out of its checkpoint and loaded as the LoRA
``name@step`` over vLLM's runtime LoRA API; requests name it; when no request pins an old
step any more it is unloaded (and its copy deleted). Step 0 is the base model.

Memory: on the CPU vLLM reserves ``kv_cache_gb`` of RAM for its cache. On a GPU it takes
``gpu_memory_utilization`` of each GPU it is given. When it shares the trainer's GPU it
sleeps during each training step (weights offloaded, cache dropped) and wakes after: new
requests wait, those in flight finish first. With several GPUs give vLLM its own
(``gpus``) and the trainer another (``device = "cuda:N"`` is a GPU index as seen by the
trainer's process).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx

from artsdk.errors import BackendError, ModelLoadError
from artsdk.futures import settle

from . import models
from .engine import MIN_TEMPERATURE, Completion, EngineRefused, Request, Seq, append

log = logging.getLogger("artsdk.local")

# LoRA ranks vLLM accepts for --max-lora-rank
_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class VLLMOptions:
    """The ``vllm`` table of the local backend's options."""

    gpus: Optional[str] = None  # CUDA_VISIBLE_DEVICES of the vLLM process, e.g. "0" or "0,1"
    gpu_memory_utilization: Optional[float] = None  # share of each of its GPUs (default 0.5 shared, 0.9 its own)
    kv_cache_gb: float = 1.0  # CPU only: RAM reserved for the KV cache
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    sleep: Optional[bool] = None  # sleep during training steps; default: when it shares the trainer's GPU
    max_loras: int = 4  # adapters in one batch (steps served at once)
    prefix_caching: bool = True  # vLLM reuses the keys and values of a prompt's start it computed before
    start_timeout: float = 900.0  # seconds to wait for it to come up
    args: list[str] = field(default_factory=list)  # more `vllm serve` arguments, as given
    log: Optional[str] = None  # its log file; default <home>/<project>/<model>/vllm.log

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "VLLMOptions":
        known = {f.name: f for f in fields(cls)}
        unknown = set(options) - set(known)
        if unknown:
            raise ValueError(f"unknown vllm option(s) {sorted(unknown)}; known: {sorted(known)}")
        out = cls(**options)
        for name, kind in (("tensor_parallel_size", int), ("data_parallel_size", int), ("max_loras", int)):
            value = getattr(out, name)
            if isinstance(value, bool) or not isinstance(value, kind) or value < 1:
                raise ValueError(f"vllm {name} must be a whole number from 1, got {value!r}")
        share = out.gpu_memory_utilization
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
            raise ValueError(f"vllm gpu_memory_utilization must be a number above 0 and at most 1, got {share!r}")
        if isinstance(out.kv_cache_gb, bool) or not isinstance(out.kv_cache_gb, (int, float)) or out.kv_cache_gb <= 0:
            raise ValueError(f"vllm kv_cache_gb must be a number above 0, got {out.kv_cache_gb!r}")
        if not isinstance(out.args, list) or not all(isinstance(a, str) for a in out.args):
            raise ValueError(f"vllm args must be a list of strings, got {out.args!r}")
        if out.gpus is not None and not isinstance(out.gpus, str):
            raise ValueError(f"vllm gpus must be a string like \"0\" or \"0,1\", got {out.gpus!r}")
        return out


class VLLMEngine:
    """The engine interface of engine.Engine (submit, publish, retire, training, close),
    answered by a vLLM server process."""

    def __init__(self, served: Any, options: VLLMOptions, *, cache: Path, dtype: Any) -> None:
        spec = served.spec
        self.name = spec.name
        self.tok = served.tokenizer
        self.stop_ids = set(served.chat.stop_ids)
        self.options = options
        self.folder = served.checkpoints.folder.parent / "vllm"
        shutil.rmtree(self.folder, ignore_errors=True)  # adapters a previous process loaded
        (self.folder / "adapters").mkdir(parents=True)
        self.log_path = Path(options.log).expanduser() if options.log else served.checkpoints.folder.parent / "vllm.log"
        where, gguf = models.resolve(spec.base_model, cache.expanduser())
        if gguf:
            raise ModelLoadError(f"base model {spec.base_model!r}: the vllm engine needs a model folder, not a "
                                 f"GGUF file; use the built-in engine, or save the model with save_pretrained")
        on_gpu = served.device.startswith("cuda")
        trainer_gpu = served.device.partition(":")[2] or "0"
        shares_gpu = on_gpu and served.trainable and (options.gpus is None or trainer_gpu in options.gpus.split(","))
        self.sleeps = shares_gpu if options.sleep is None else bool(options.sleep)
        rank = next((r for r in _VLLM_RANKS if r >= served.lora_config.r), served.lora_config.r)
        self.key = secrets.token_urlsafe(24)
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        # through vllm_process.py: vLLM's server, stopped if this process dies without closing it
        argv = [sys.executable, "-m", "backends.local.vllm_process",
                "--model", str(where), "--served-model-name", self.name,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", str(dtype).removeprefix("torch."),
                "--max-model-len", str(served.context_length),
                "--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(options.max_loras),
                "--max-cpu-loras", str(options.max_loras * 2),
                "--logprobs-mode", "processed_logprobs",
                "--generation-config", "vllm",  # vLLM's neutral defaults, not the model's (top_k 20...)
                "--tensor-parallel-size", str(options.tensor_parallel_size),
                "--data-parallel-size", str(options.data_parallel_size),
                "--disable-uvicorn-access-log",
                # its key on every route, not only under /v1, and no interactive docs
                "--middleware", "backends.local.vllm_guard.KeyOnEveryRoute", "--disable-fastapi-docs",
                "--enable-prefix-caching" if options.prefix_caching else "--no-enable-prefix-caching"]
        if on_gpu:
            # sharing, the trainer's weights and optimizer state stay on the GPU beside vLLM's
            share = options.gpu_memory_utilization or (0.5 if shares_gpu else 0.9)
            argv += ["--gpu-memory-utilization", str(share)]
        else:
            argv += ["--kv-cache-memory-bytes", str(int(options.kv_cache_gb * 2**30)), "--enforce-eager"]
        if self.sleeps:
            argv += ["--enable-sleep-mode"]
        argv += options.args
        env = {**os.environ, "VLLM_API_KEY": self.key, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "VLLM_SERVER_DEV_MODE": "1" if self.sleeps else "0", "TOKENIZERS_PARALLELISM": "false"}
        if options.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = options.gpus
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("%s: starting vLLM (log: %s)", self.name, self.log_path)
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            # its own process group, so close() stops vLLM's engine processes too
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.PIPE, start_new_session=True)
        atexit.register(self._stop_process)
        # one event loop thread talks to it; callers get concurrent futures
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="artsdk-vllm", daemon=True)
        self._thread.start()
        self.client: Optional[httpx.AsyncClient] = None
        self.in_flight = 0
        self._awake = asyncio.Event()
        self._idle = asyncio.Event()
        try:
            self._call(self._start(), timeout=options.start_timeout + 30)
        except BaseException:
            self.close()
            raise

    # -- the process ---------------------------------------------------------------------

    async def _start(self) -> None:
        self.client = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(None, connect=10.0),
                                        headers={"Authorization": f"Bearer {self.key}"},
                                        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=64))
        self._awake.set()
        self._idle.set()
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ModelLoadError(f"vLLM exited with code {code} while starting; the end of its log "
                                     f"({self.log_path}):\n{_tail(self.log_path)}")
            try:
                if (await self.client.get("/health", timeout=5.0)).status_code == 200:
                    log.info("%s: vLLM is serving on %s", self.name, self.base_url)
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ModelLoadError(f"vLLM did not come up within {self.options.start_timeout:.0f} s "
                                     f"(vllm option start_timeout); the end of its log ({self.log_path}):\n"
                                     f"{_tail(self.log_path)}")
            await asyncio.sleep(0.5)

    def _call(self, coro: Any, timeout: Optional[float] = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _stop_process(self) -> None:
        if self.process.poll() is not None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()  # its watch ends the process group too (vllm_process.py)
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(10)

    def close(self) -> None:
        if self.client is not None and self.loop.is_running():
            try:
                self._call(self.client.aclose(), timeout=10)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self._stop_process()
        atexit.unregister(self._stop_process)
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- generation ----------------------------------------------------------------------

    def submit(self, req: Request) -> "Future[list[Completion]]":
        if self.process.poll() is not None:
            raise RuntimeError(f"vLLM has stopped (exit code {self.process.returncode}); see {self.log_path}")
        asyncio.run_coroutine_threadsafe(self._generate(req), self.loop)
        return req.future

    def _model(self, step: int) -> str:
        return self.name if step == 0 else f"{self.name}@{step}"

    async def _generate(self, req: Request) -> None:
        await self._awake.wait()  # not while asleep for a training step
        if req.cancelled:  # its client went away meanwhile
            settle(req.future, [Completion(finish_reason="cancelled") for _ in range(req.n)])
            return
        self.in_flight += 1
        self._idle.clear()
        try:
            outs = await self._complete(req)
        except Exception as e:  # noqa: BLE001 - reported to the request
            settle(req.future, error=e)
        else:
            settle(req.future, outs)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def _complete(self, req: Request) -> list[Completion]:
        temperature = 0.0 if req.temperature <= 0 else max(req.temperature, MIN_TEMPERATURE)
        body: dict[str, Any] = {
            "model": self._model(req.step), "prompt": req.prompt, "max_tokens": req.max_tokens, "n": req.n,
            "temperature": temperature, "top_p": req.top_p, "min_tokens": req.min_tokens,
            # every other sampling setting stated, so vLLM samples exactly the distribution the trainer
            # scores (it fills unsent ones from the model's generation_config.json, unless told not to)
            "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "stop": req.stop or None, "stop_token_ids": sorted(self.stop_ids), "seed": req.seed,
            "logprobs": 0, "return_token_ids": True, "stream": True, "skip_special_tokens": False,
        }
        seqs = [Seq(req, i) for i in range(req.n)]
        if temperature == 0 and req.n > 1:  # vLLM samples greedy choices one at a time
            await asyncio.gather(*(self._stream({**body, "n": 1}, [s]) for s in seqs))
        else:
            await self._stream(body, seqs)
        return [s.out for s in seqs]

    async def _stream(self, body: dict[str, Any], seqs: list[Seq]) -> None:
        """Feed each token vLLM streams back to its choice until every choice is done."""
        assert self.client is not None
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                message = _message((await response.aread()).decode(errors="replace"))
                if 400 <= response.status_code < 500:
                    raise EngineRefused(f"vLLM refused the request: {message}")
                raise BackendError(f"vLLM answered {response.status_code}: {message}; see {self.log_path}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise BackendError(f"vLLM failed: {_message(line[6:])}; see {self.log_path}")
                for choice in chunk.get("choices", []):
                    s = seqs[choice["index"]]
                    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
                    for token, logprob in zip(choice.get("token_ids") or [], logprobs):
                        if not s.done:
                            append(s, int(token), float(logprob), self.tok, self.stop_ids)
                    if choice.get("finish_reason") and not s.done:
                        # vLLM stopped where the shared rules did not (a stop string its own
                        # detokenizer saw first): its reason stands
                        s.out.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
                        s.done = True
                if all(s.done for s in seqs):
                    break  # leaving the stream aborts whatever vLLM still generates
        for s in seqs:
            if not s.done:
                raise BackendError(f"vLLM's answer ended early (choice {s.index} had no finish); see {self.log_path}")

    # -- adapters ------------------------------------------------------------------------

    def publish(self, step: int, folder: Optional[Path] = None, weights: Any = None) -> None:
        """Load the adapter of checkpoint ``folder`` as ``name@step`` into the running vLLM (no
        sleep, no drain: requests in flight go on). It is copied first: checkpoints are pruned
        on their own schedule, and vLLM may read the files again. (``weights``: unused.)"""
        if folder is None:
            raise BackendError("the vllm engine loads adapters from their checkpoint folder")
        copy = self.folder / "adapters" / str(step)
        shutil.rmtree(copy, ignore_errors=True)
        copy.mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(folder / name, copy / name)
        self._call(self._post("/v1/load_lora_adapter", {"lora_name": self._model(step), "lora_path": str(copy)}))

    def retire(self, step: int) -> None:
        """Unload ``step``'s adapter (no request pins it). Never waits: this may run on the
        event loop, as the done-callback of the last request that used it."""
        async def unload() -> None:
            try:
                await self._post("/v1/unload_lora_adapter", {"lora_name": self._model(step)})
            except Exception as e:  # noqa: BLE001 - a leftover adapter costs memory, not answers
                log.warning("%s: unloading step %d from vLLM failed: %s", self.name, step, e)
            shutil.rmtree(self.folder / "adapters" / str(step), ignore_errors=True)

        asyncio.run_coroutine_threadsafe(unload(), self.loop)

    def loaded(self) -> set[str]:
        """The models vLLM serves now: the base model and the steps' adapters."""
        async def models() -> set[str]:
            assert self.client is not None
            r = await self.client.get("/v1/models")
            r.raise_for_status()
            return {m["id"] for m in r.json()["data"]}

        return set(self._call(models()))

    async def _post(self, path: str, body: Optional[dict[str, Any]] = None) -> None:
        assert self.client is not None
        r = await self.client.post(path, json=body)
        if r.status_code != 200:
            raise BackendError(f"vLLM {path} answered {r.status_code}: {_message(r.text)}")

    # -- training ------------------------------------------------------------------------

    @contextmanager
    def training(self) -> Iterator[None]:
        """While the trainer runs: on a shared GPU vLLM sleeps (new requests wait, those in
        flight finish first); otherwise it keeps answering."""
        if not self.sleeps:
            yield
            return
        self._call(self._sleep(), timeout=None)  # once the requests in flight are answered
        try:
            yield
        finally:
            self._call(self._wake())

    async def _sleep(self) -> None:
        self._awake.clear()
        await self._idle.wait()
        await self._post("/sleep?level=1")

    async def _wake(self) -> None:
        try:
            await self._post("/wake_up")
        finally:
            self._awake.set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _message(text: str) -> str:
    """vLLM's error message out of its JSON answer (or the text as it came)."""
    try:
        data = json.loads(text)
        error = data.get("error", data)
        return str(error.get("message", error) if isinstance(error, dict) else error)[:500]
    except (ValueError, AttributeError):
        return text[:500]
