"""The cost of the HTTP hop: inference tokens/s and seconds per training step through
``artsdk serve`` next to the local backend in-process, same model, same load, one run.

    python -m bench.remote_overhead [--model tiny] [--concurrent 16] [--tokens 32]

Writes bench/results/remote_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

import artsdk as art
from bench.common import local_model, model_arguments, pin_threads, save_result
from backends.remote import RemoteBackend
from bench.train_throughput import make_groups

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]


async def measure(backend, model: art.TrainableModel, a: argparse.Namespace, vocab: int) -> dict:
    endpoint = await backend.register(model)
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)

    async def burst() -> float:
        async def one() -> int:
            r = await client.chat.completions.create(model=model.name, messages=PROMPT, max_tokens=a.tokens,
                                                     extra_body={"min_tokens": a.tokens})
            return len(r.choices[0].model_extra["token_ids"])

        t0 = time.perf_counter()
        n = sum(await asyncio.gather(*(one() for _ in range(a.concurrent))))
        return n / (time.perf_counter() - t0)

    await burst()  # warm up
    rates = [await burst() for _ in range(a.repeat)]
    groups = make_groups(4, 4, vocab)
    await backend.train(model, groups)  # warm up
    steps = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        await backend.train(model, groups)
        steps.append(time.perf_counter() - t0)
    await client.close()
    return {"tokens_per_s": max(rates), "seconds_per_step": statistics.median(steps)}


async def main_async(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        local, model, _ = await local_model(a.model, str(home / "local"), name="hop")
        vocab = len(local.models["hop"].tokenizer)
        inproc = await measure(local, model, a, vocab)
        await local.close()

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (home / "serve").mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "artsdk.cli", "serve", "--port", str(port),
                                 "--home", str(home / "serve"), "--option", "device=cpu"],
                                cwd=home, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
            remote = RemoteBackend(f"http://127.0.0.1:{port}")
            served = await measure(remote, model, a, vocab)
            await remote.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "model": a.model, "concurrent": a.concurrent, "tokens": a.tokens,
        "in_process": inproc, "through_serve": served,
        "inference_ratio": served["tokens_per_s"] / inproc["tokens_per_s"],
        "training_ratio": inproc["seconds_per_step"] / served["seconds_per_step"],
    }


def main() -> None:
    ap = model_arguments(model="tiny")
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    pin_threads(a.threads)
    r = asyncio.run(main_async(a))
    save_result("remote_overhead" + ("_tiny" if a.model == "tiny" else ""), r)
    print(f"{a.model}: inference {r['through_serve']['tokens_per_s']:.0f} tok/s through artsdk serve vs "
          f"{r['in_process']['tokens_per_s']:.0f} in-process (ratio {r['inference_ratio']:.2f}); training "
          f"{r['through_serve']['seconds_per_step']:.2f} s/step vs {r['in_process']['seconds_per_step']:.2f} "
          f"(ratio {r['training_ratio']:.2f})")


if __name__ == "__main__":
    main()
