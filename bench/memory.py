"""Peak memory (RSS) of the local backend: loading the model, gathering a batch like the
demo's (8 prompts x 8 samples, 16 tokens each) and training on it, for several
``tokens_per_row`` and ``max_batch`` settings, each in a fresh process.

    python -m bench.memory [--model HuggingFaceTB/SmolLM2-135M-Instruct]

Writes bench/results/memory.json.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time

from bench.common import model_arguments, pin_threads, save_result

CONFIGS = [  # (tokens_per_row, max_batch, gradient_checkpointing)
    (256, 64, False), (512, 64, False), (1024, 64, False), (2048, 64, False), (512, 16, False),
    (2048, 64, True),
]


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB on Linux


async def one(model_id: str, tokens_per_row: int, max_batch: int, checkpointing: bool) -> dict:
    from openai import AsyncOpenAI

    import artsdk as art
    from backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as home:
        art.configure(home=home, store=f"{home}/store.db", progress=False)
        out = {"tokens_per_row": tokens_per_row, "max_batch": max_batch, "gradient_checkpointing": checkpointing}
        be = LocalBackend(device="cpu", max_batch=max_batch)
        model = art.TrainableModel("mem", base_model=model_id, config={"train": {
            "tokens_per_row": tokens_per_row, "gradient_checkpointing": checkpointing}})
        client = AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused")

        @art.rollout
        async def answer(i: int) -> str:
            r = await client.chat.completions.create(
                model="mem", messages=[{"role": "user", "content": f"What is {i} + {i + 7}? Answer with the number only."}],
                max_tokens=16)
            return r.choices[0].message.content or ""

        @art.reward
        def length(t: art.Trajectory) -> float:
            return float(len(t.outcome or ""))

        async with art.session(model, backend=be) as run:
            out["after_load_gb"] = peak_gb()
            t0 = time.perf_counter()
            groups = await art.gather(answer, range(8), group_size=8, rewards=[length])
            out["gather_seconds"] = time.perf_counter() - t0
            out["after_gather_gb"] = peak_gb()
            steps = []
            for _ in range(2):
                result = await run.train(groups)
                steps.append(result.metrics["seconds"])
            out["train_seconds"] = min(steps)
            out["tokens_per_step"] = result.metrics["tokens_total"]
            out["after_train_gb"] = peak_gb()
        await client.close()
    return out


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--one", nargs=3, type=int, metavar=("TOKENS_PER_ROW", "MAX_BATCH", "CHECKPOINTING"))
    a = ap.parse_args()
    pin_threads(a.threads)
    if a.one:
        print(json.dumps(asyncio.run(one(a.model, a.one[0], a.one[1], bool(a.one[2])))))
        return
    rows = []
    for tpr, mb, gc in CONFIGS:
        proc = subprocess.run([sys.executable, "-m", "bench.memory", "--model", a.model, "--one", str(tpr), str(mb),
                               str(int(gc))], capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    save_result("memory", {"model": a.model, "rows": rows})


if __name__ == "__main__":
    main()
