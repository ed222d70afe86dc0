"""What overlapping rollouts with training buys: an agent whose tool waits a fixed time each
turn, trained for several steps sequentially (gather, then train) and with ``run.loop``
(``max_policy_lag=1``), in one run on the local backend; wall time as a ratio, with each
step's training reward for both.

    python -m bench.pipeline [--model tiny] [--steps 6] [--tool-s 2.0] [--turns 3]

The tool's wait is set so a step's rollouts take about as long as its training (the issue's
case: an agent spends most of its time in its tools and environment). On the local backend
with one device the model either generates or trains; what overlaps is the rollouts' waiting
with training. Writes bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

import artsdk as art
from bench.common import model_arguments, pin_threads, save_result


def make_agent(client: Any, turns: int, tool_s: float) -> Any:
    @art.rollout
    async def agent(q: str) -> str:
        messages = [{"role": "user", "content": q}]
        for k in range(turns):
            r = await client.chat.completions.create(model="bench", messages=messages, max_tokens=8, temperature=1.0)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": f"the tool says {k}"}]
            await asyncio.sleep(tool_s)  # the tool's (or the environment's) wait
        return messages[-2]["content"]

    return agent


@art.reward
def first_token(t: art.Trajectory) -> float:
    return float(t.calls[0].choices[0].token_ids[0] % 5) if t.calls and t.calls[0].choices else 0.0


async def one(how: str, a: argparse.Namespace) -> dict[str, Any]:
    from openai import AsyncOpenAI

    from backends.local import LocalBackend

    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    agent = make_agent(client, a.turns, a.tool_s)
    questions = [f"question {i}" for i in range(a.steps * a.per_step)]
    with tempfile.TemporaryDirectory() as home:
        art.configure(home=home, store=f"{home}/store.db")
        if a.backend == "ray":  # one replica and one rank, each on a core of its own
            from backends.ray import RayBackend

            be = RayBackend(device="cpu", home=home, replicas=1, trainers=1)
        else:
            be = LocalBackend(device="cpu", home=home)
        model = art.TrainableModel("bench", base_model=a.model, project="pipeline",
                                   config={"train": {"seed": 0, "epochs": a.epochs}})
        async with art.session(model, backend=be) as run:
            t0 = time.perf_counter()
            if how == "sequential":
                results = []
                for k in range(a.steps):
                    groups = await art.gather(agent, questions[k * a.per_step:(k + 1) * a.per_step],
                                              group_size=a.group_size, rewards=[first_token])
                    results.append(await run.train(groups))
            else:
                results = [r async for r in run.loop(agent, questions, group_size=a.group_size,
                                                     rewards=[first_token], steps=a.steps,
                                                     scenarios_per_step=a.per_step, max_policy_lag=1)]
            wall = time.perf_counter() - t0
        await be.close()
    await client.close()
    return {"wall_s": wall, "train_s": sum(r.metrics.get("seconds", 0.0) for r in results),
            "rewards": [r.metrics.get("reward_mean") for r in results],
            "policy_lag_max": max(r.metrics.get("policy_lag_max", 0.0) for r in results),
            "steps": len(results)}


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    pairs = []
    for _ in range(a.repeat):  # each pair in turn, so both see the same machine
        pairs.append((await one("sequential", a), await one("pipelined", a)))
    seq, pipe = pairs[0]
    ratios = [p["wall_s"] / s["wall_s"] for s, p in pairs]
    mean = sum(ratios) / len(ratios)
    se = (sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1) / len(ratios)) ** 0.5 if len(ratios) > 1 else None
    out = {"model": a.model, "backend": a.backend, "threads": a.threads, "steps": a.steps, "scenarios_per_step": a.per_step,
           "group_size": a.group_size, "turns": a.turns, "tool_s": a.tool_s, "sequential": seq, "pipelined": pipe,
           "ratio": mean, "ratio_se": se, "ratios": ratios, "repeats": a.repeat}
    print(f"sequential {seq['wall_s']:.1f} s (training {seq['train_s']:.1f} s), pipelined {pipe['wall_s']:.1f} s "
          f"(training {pipe['train_s']:.1f} s): {out['ratio']:.2f}x the wall time; policy lag at most "
          f"{pipe['policy_lag_max']:.0f}")
    return out


def main() -> None:
    ap = model_arguments(description=__doc__.split("\n\n")[0], model="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tool-s", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=30, help="passes over a step's batch: the step's training time")
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs (the ratio's mean and standard error)")
    ap.add_argument("--backend", choices=["local", "ray"], default="local")
    a = ap.parse_args()
    pin_threads(a.threads)
    if a.backend == "ray":
        import ray

        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    save_result("pipeline" + ("_ray" if a.backend == "ray" else ""), asyncio.run(main_async(a)))


if __name__ == "__main__":
    main()
