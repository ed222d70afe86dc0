"""The local backend's two engines side by side, same machine, same run: the built-in one and
vLLM (``engine = "vllm"``), on SmolLM2-135M with a trained LoRA adapter being served.

    python -m bench.engines [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--tokens 32]

For each engine: its start-up (register), the end-to-end time of a step of the review
labeller (examples/reviews: gather 8 reviews x 8 answers, then train), and inference tokens/s
over HTTP at 1, 4, 16 and 64 concurrent requests, every answer exactly ``--tokens`` long
(``min_tokens``), on the step the training just published. Writes bench/results/engines.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from openai import AsyncOpenAI

import artsdk as art
from bench.common import model_arguments, pin_threads, save_result
from examples.reviews import agent
from examples.reviews.reviews import reviews

PROMPT = [{"role": "user", "content": "Tell me a short story about a robot learning to play chess."}]
CONCURRENCY = (1, 4, 16, 64)


async def rate(client: AsyncOpenAI, concurrent: int, tokens: int) -> float:
    async def one() -> int:
        r = await client.chat.completions.create(model=agent.MODEL, messages=PROMPT, max_tokens=tokens,
                                                 extra_body={"min_tokens": tokens})
        return len(r.choices[0].model_extra["token_ids"])

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(concurrent)))
    return sum(counts) / (time.perf_counter() - t0)


async def measure(engine: str, a: argparse.Namespace) -> dict[str, Any]:
    from backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as home:
        be = LocalBackend(device="cpu", home=home, engine=engine, threads=a.threads)
        model = art.TrainableModel(agent.MODEL, base_model=a.model, project="bench-engines")
        t0 = time.perf_counter()
        endpoint = await be.register(model)
        startup = time.perf_counter() - t0
        agent.client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        steps = []
        async with art.session(model, backend=be) as run:
            for step in range(a.steps):
                t0 = time.perf_counter()
                groups = await art.gather(agent.label, reviews(8, step), group_size=8, rewards=[agent.correct])
                gathered = time.perf_counter() - t0
                result = await run.train(groups)
                steps.append({"gather_s": gathered, "train_s": time.perf_counter() - t0 - gathered,
                              "step_s": time.perf_counter() - t0, "trained": result.trained,
                              "logprob_mismatch": result.metrics.get("logprob_mismatch")})
                print(f"{engine}: step {step + 1}: gather {gathered:.1f} s, train {steps[-1]['train_s']:.1f} s, "
                      f"mismatch {steps[-1]['logprob_mismatch']}", flush=True)
            client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            await rate(client, 2, 4)  # warm up
            rates = {}
            for n in CONCURRENCY:
                rates[n] = max([await rate(client, n, a.tokens) for _ in range(a.repeat)])
                print(f"{engine}: {n:>2} concurrent: {rates[n]:7.1f} tok/s", flush=True)
            await client.close()
        await agent.client.close()
        await be.close()
    return {"startup_s": startup, "steps": steps, "tokens_per_s": rates}


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    out = {"model": a.model, "tokens_per_answer": a.tokens, "engines": {}}
    for engine in ("builtin", "vllm"):
        out["engines"][engine] = await measure(engine, a)
    b, v = out["engines"]["builtin"], out["engines"]["vllm"]
    out["rows"] = [{"concurrent": n, "builtin_tokens_per_s": b["tokens_per_s"][n],
                    "vllm_tokens_per_s": v["tokens_per_s"][n],
                    "vllm_over_builtin": v["tokens_per_s"][n] / b["tokens_per_s"][n]} for n in CONCURRENCY]
    for e in ("builtin", "vllm"):
        s = out["engines"][e]["steps"]
        out["engines"][e]["mean_step_s"] = sum(x["step_s"] for x in s) / len(s)
        out["engines"][e]["mean_gather_s"] = sum(x["gather_s"] for x in s) / len(s)
    print(f"step time vLLM / built-in: {v['mean_step_s'] / b['mean_step_s']:.2f}")
    return out


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    pin_threads(a.threads)
    save_result("engines", asyncio.run(main_async(a)))


if __name__ == "__main__":
    main()
