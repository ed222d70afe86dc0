"""Peak memory (RSS) of the local backend.

    python -m bench.memory --demo [--check]          # the demo's path, peak beside its floor
    python -m bench.memory [--model HuggingFaceTB/SmolLM2-135M-Instruct]    # settings, one by one

``--demo`` runs what ``make demo`` runs (``examples.reviews.train``: SmolLM2-135M, 8 x 8 rollouts
a step), for ``--steps`` steps (2: the peak is reached by the second step's training) and
``--eval-games`` held-out reviews, in a fresh process with a store and checkpoints of its own,
and prints its peak resident memory beside the floor any run of it needs: the base weights, the
LoRA adapter, its gradients and the optimizer's state (their sizes on disk). It writes
bench/results/memory_demo.json, which docs/benchmarks.md shows. ``--check`` fails (exit 1) when
the peak is more than 10% over the figure recorded there in two runs (the second run only when the
first is over): the guard tests/test_memory_guard.py runs.

Without ``--demo``: loading the model, gathering a batch like the demo's (8 prompts x 8 samples,
16 tokens each) and training on it, for several ``tokens_per_row`` and ``max_batch`` settings,
each in a fresh process; writes bench/results/memory.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import load_result, model_arguments, pin_threads, save_result

ROOT = Path(__file__).resolve().parent.parent
GROWTH = 1.10  # the demo's peak may exceed the recorded one by this much before the guard fails

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


def demo_peak(steps: int, eval_games: int, threads: int) -> dict:
    """Run the demo's training for ``steps`` steps in a fresh process; its peak RSS and floor, in MB."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "ARTSDK_HOME": f"{home}/home", "ARTSDK_STORE": f"{home}/store.db",
               "ARTSDK_PROGRESS": "false", "OMP_NUM_THREADS": str(threads), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        command = [sys.executable, "-m", "examples.reviews.train", "--steps", str(steps),
                   "--eval-games", str(eval_games)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = proc.stdout.read().decode(errors="replace")  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not any other's
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"the demo failed ({proc.returncode}):\n{output[-3000:]}")
        step = Path(home, "home", "reviews", "review-agent", "checkpoints", str(steps))
        cache = Path(os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk")
        weights = sum(f.stat().st_size for f in (cache / "SmolLM2-135M-Instruct").glob("*.safetensors"))
        lora = (step / "adapter_model.safetensors").stat().st_size
        optimizer = (step / "optimizer.pt").stat().st_size
        solved = [line for line in output.splitlines() if line.startswith("eval after")]
        return {"steps": steps, "eval_games": eval_games, "threads": threads, "command": " ".join(command[1:]),
                "peak_mb": usage.ru_maxrss / 1024, "seconds": time.perf_counter() - t0,
                "floor_mb": (weights + 2 * lora + optimizer) / 2**20, "weights_mb": weights / 2**20,
                "lora_mb": lora / 2**20, "optimizer_mb": optimizer / 2**20, "eval_after": solved[-1] if solved else ""}


def demo_run(a: "object") -> dict:
    r = demo_peak(a.steps, a.eval_games, a.threads)  # type: ignore[attr-defined]
    print(f"the demo's path ({r['steps']} steps): peak {r['peak_mb']:,.0f} MB resident; floor {r['floor_mb']:,.0f} MB "
          f"(weights {r['weights_mb']:,.0f} + LoRA {r['lora_mb']:,.1f} and its gradients + optimizer "
          f"{r['optimizer_mb']:,.1f}); {r['seconds']:.0f} s; {r['eval_after']}", flush=True)
    return r


def demo(a: "object") -> None:
    r = demo_run(a)
    if a.check:  # type: ignore[attr-defined]
        recorded = (load_result("memory_demo") or {}).get("peak_mb")
        if recorded is None:
            raise SystemExit("no recorded figure (bench/results/memory_demo.json): run python -m bench.memory --demo")
        limit = recorded * GROWTH
        print(f"recorded {recorded:,.0f} MB; limit {limit:,.0f} MB (+{GROWTH - 1:.0%})", flush=True)
        if r["peak_mb"] > limit:  # once more: a regression peaks over in every run, not in one of them
            print("over the limit; running it again (the same run peaks up to 100 MB apart from run to run)", flush=True)
            again = demo_run(a)
            if again["peak_mb"] > limit:
                raise SystemExit(f"the demo's peak memory grew: {r['peak_mb']:,.0f} and {again['peak_mb']:,.0f} MB "
                                 f"against {recorded:,.0f} MB recorded in docs/benchmarks.md (more than "
                                 f"{GROWTH - 1:.0%} over in two runs)")
        return
    runs = (load_result("memory_demo") or {}).get("runs", []) if a.keep else []  # type: ignore[attr-defined]
    runs.append(r)
    save_result("memory_demo", {**r, "peak_mb": max(x["peak_mb"] for x in runs), "runs": runs})


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--one", nargs=3, type=int, metavar=("TOKENS_PER_ROW", "MAX_BATCH", "CHECKPOINTING"))
    ap.add_argument("--demo", action="store_true", help="the demo's path (examples.reviews.train), peak beside floor")
    ap.add_argument("--steps", type=int, default=2, help="with --demo: training steps")
    ap.add_argument("--eval-games", type=int, default=4, help="with --demo: held-out reviews before and after")
    ap.add_argument("--check", action="store_true", help="with --demo: fail if the peak is 10%% over the recorded one")
    ap.add_argument("--keep", action="store_true", help="with --demo: add this run to the recorded ones (the "
                                                          "recorded peak is the highest)")
    a = ap.parse_args()
    if a.demo:
        demo(a)
        return
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
