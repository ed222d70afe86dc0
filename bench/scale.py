"""The ray backend against the local backend, same model, same load, one run, on a Ray
instance on this machine:

- **parity**: the same groups trained by N trainer ranks and by the local backend's one
  process -- loss, gradient norm, and how far apart the adapters end up;
- **rollouts**: generated tokens/s through the router with 1 and 2 replicas, beside the local
  backend's endpoint (concurrent requests, fixed length);
- **a step's time**, split: the ranks' training, writing the checkpoint, loading it on every
  replica; and what a loop of gather + train spends on each.

    python -m bench.scale [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--concurrent 32] [--tokens 32]

Writes bench/results/scale.json. On a machine with few cores, replicas and ranks share them:
the figures say what the machinery costs, not what more machines give.

    python -m bench.scale --part sharding   # bench/results/scale_sharding.json
    python -m bench.scale --part publish    # bench/results/scale_publish.json

- **sharding**: two trainer ranks holding the whole model, then sharded (``shard = "fsdp"``):
  what each rank holds of the weights, its resident memory, and a step's time and loss;
- **publish**: a step published to a replica while 16 long requests are being decoded: how
  long loading it took, how long those requests still ran after it (what waiting for them, as
  loading a step used to, would have cost), and whether any was cut or changed step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from openai import AsyncOpenAI

import artsdk as art
from bench.common import model_arguments, pin_threads, save_result
from bench.train_throughput import make_groups

PROMPT = [{"role": "user", "content": "Tell me about the sea."}]


async def tokens_per_s(base_url: str, key: str, name: str, concurrent: int, tokens: int, repeat: int) -> float:
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)

    async def burst() -> float:
        async def one(i: int) -> int:
            r = await client.chat.completions.create(
                model=name, max_tokens=tokens, extra_body={"min_tokens": tokens},
                messages=[{"role": "user", "content": f"{PROMPT[0]['content']} ({i})"}])
            return len(r.choices[0].model_extra["token_ids"])

        t0 = time.perf_counter()
        n = sum(await asyncio.gather(*(one(i) for i in range(concurrent))))
        return n / (time.perf_counter() - t0)

    await burst()  # warm up
    rates = [await burst() for _ in range(repeat)]
    await client.close()
    return max(rates)


async def main_async(a: argparse.Namespace) -> dict:
    from backends.local import LocalBackend
    from backends.ray import RayBackend

    import ray

    settings = {"minibatches": 2, "learning_rate": 1e-3}
    out: dict = {"model": a.model, "cpus": os.cpu_count(), "concurrent": a.concurrent, "tokens": a.tokens}
    ray.init(address="local", num_cpus=max(6, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as home:
            model = art.TrainableModel("bench", base_model=a.model, project="bench", config={"train": settings})
            local = LocalBackend(device="cpu", home=f"{home}/local")
            endpoint = await local.register(model)
            vocab = local.models["bench"].model.get_input_embeddings().weight.shape[0]
            groups = make_groups(8, 8, vocab)
            out["local_tokens_per_s"] = await tokens_per_s(endpoint.base_url, endpoint.api_key, "bench", a.concurrent,
                                                           a.tokens, a.repeat)
            one = await local.train(model, groups)
            await local.close()
            out["runs"] = []
            for replicas, trainers in ((1, 1), (2, 2)):
                be = RayBackend(device="cpu", home=f"{home}/ray{replicas}{trainers}", replicas=replicas,
                                trainers=trainers)
                t0 = time.perf_counter()
                endpoint = await be.register(model)
                started = time.perf_counter() - t0
                rate = await tokens_per_s(endpoint.base_url, endpoint.api_key, "bench", a.concurrent, a.tokens,
                                          a.repeat)
                steps = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    r = await be.train(model, groups)
                    steps.append({"seconds": time.perf_counter() - t0, **{k: r.metrics[k] for k in (
                        "seconds_ranks", "seconds_checkpoint", "seconds_publish", "loss", "grad_norm")}})
                first = steps[0]
                run = {"replicas": replicas, "trainers": trainers, "start_seconds": started, "tokens_per_s": rate,
                       "step_seconds": statistics.median(s["seconds"] for s in steps),
                       "ranks_seconds": statistics.median(s["seconds_ranks"] for s in steps),
                       "checkpoint_seconds": statistics.median(s["seconds_checkpoint"] for s in steps),
                       "publish_seconds": statistics.median(s["seconds_publish"] for s in steps),
                       # the first step trained the same groups from the same start as the local backend's
                       "loss": first["loss"], "grad_norm": first["grad_norm"],
                       "loss_vs_local": abs(first["loss"] - one.metrics["loss"]),
                       "grad_norm_vs_local": abs(first["grad_norm"] - one.metrics["grad_norm"])}
                loop = await gather_and_train(be, model, endpoint, a)
                run.update(loop)
                out["runs"].append(run)
                await be.close()
            out["local_loss"], out["local_grad_norm"] = one.metrics["loss"], one.metrics["grad_norm"]
    finally:
        ray.shutdown()
    return out


async def gather_and_train(be, model: art.TrainableModel, endpoint, a: argparse.Namespace) -> dict:
    """Two steps of a real loop (gather 8 x 4 rollouts, train): where the time goes."""
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)

    @art.rollout
    async def talk(q: str) -> str:
        r = await client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": q}],
                                                 max_tokens=a.tokens)
        return r.choices[0].message.content

    @art.reward
    def length(t: art.Trajectory) -> float:
        return float(len(t.outcome or ""))

    rollout = train = 0.0
    t_all = time.perf_counter()
    async with art.session(model, backend=be) as run:
        for step in range(2):
            t0 = time.perf_counter()
            groups = await art.gather(talk, [f"Describe {w}." for w in ("rain", "snow", "sun", "wind")] * 2,
                                      group_size=4, rewards=[length])
            t1 = time.perf_counter()
            await run.train(groups)
            rollout, train = rollout + t1 - t0, train + time.perf_counter() - t1
    total = time.perf_counter() - t_all
    await client.close()
    return {"loop_rollout_seconds": rollout, "loop_train_seconds": train,
            "loop_other_seconds": total - rollout - train}


async def model_and_groups(base_model: str, home: str, groups: int, size: int) -> tuple[art.TrainableModel, list]:
    """The benchmark's model and ``groups`` x ``size`` trajectories of its tokens."""
    from backends.local import LocalBackend

    model = art.TrainableModel("bench", base_model=base_model, project="bench", config={"train": {"learning_rate": 1e-3}})
    tokens = LocalBackend(device="cpu", home=f"{home}/tokens", http=False)
    await tokens.register(model)
    made = make_groups(groups, size, tokens.models["bench"].model.get_input_embeddings().weight.shape[0])
    await tokens.close()
    return model, made


async def sharding(a: argparse.Namespace) -> dict:
    """Two ranks, whole then sharded: what a rank holds, and the step it makes."""
    import ray

    from backends.ray import RayBackend

    out: dict = {"model": a.model, "cpus": os.cpu_count(), "runs": []}
    ray.init(address="local", num_cpus=max(6, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as home:
            model, groups = await model_and_groups(a.model, home, 4, 8)
            for shard in ("none", "fsdp"):
                be = RayBackend(device="cpu", home=f"{home}/{shard}", replicas=1, trainers=2, shard=shard)
                await be.register(model)
                t0 = time.perf_counter()
                r = await be.train(model, groups)
                seconds = time.perf_counter() - t0
                ranks = [await rank.info.remote() for rank in be.deployments["bench"].ranks]
                out["runs"].append({"shard": shard, "step_seconds": seconds, "loss": r.metrics["loss"],
                                    "grad_norm": r.metrics["grad_norm"],
                                    "params_fraction": [x["rank_params_fraction"] for x in ranks],
                                    "weights_gb": [x["rank_weights_gb"] for x in ranks],
                                    "peak_rss_gb": [x["peak_rss_gb"] for x in ranks],
                                    "rss_gb": [x["rss_gb"] for x in ranks]})
                await be.close()
    finally:
        ray.shutdown()
    return out


async def publish(a: argparse.Namespace) -> dict:
    """A step published while 16 long requests are decoded on the one replica."""
    import ray

    from backends.ray import RayBackend

    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as home:
            model, groups = await model_and_groups(a.model, home, 2, 4)
            be = RayBackend(device="cpu", home=f"{home}/ray", replicas=1, trainers=1)
            endpoint = await be.register(model)
            await be.train(model, groups)  # step 1 (the replica's first adapters are made with no batch running)
            client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            ended: list[float] = []

            async def long(i: int) -> tuple[int, str, str]:
                r = await client.chat.completions.create(
                    model="bench", max_tokens=a.long_tokens, extra_body={"min_tokens": a.long_tokens},
                    messages=[{"role": "user", "content": f"{PROMPT[0]['content']} ({i})"}])
                ended.append(time.perf_counter())
                return len(r.choices[0].model_extra["token_ids"]), r.choices[0].finish_reason, r.model

            d = be.deployments["bench"]
            metrics = await d.ranks[0].train.remote(2, groups, {})  # step 2 made, not yet published
            calls = [asyncio.ensure_future(long(i)) for i in range(16)]
            await asyncio.sleep(a.settle)  # the 16 are one batch being decoded
            t0 = time.perf_counter()
            _, m, _ = await d._commit(2, metrics)
            published = time.perf_counter()
            answers = await asyncio.gather(*calls)
            await client.close()
            await be.close()
    finally:
        ray.shutdown()
    return {"model": a.model, "cpus": os.cpu_count(), "requests": 16, "tokens": a.long_tokens,
            "commit_seconds": published - t0, "publish_seconds": m["seconds_publish"],
            "decoding_after_publish_seconds": min(ended) - published,
            "whole": sum(n == a.long_tokens and reason == "length" for n, reason, _ in answers),
            "steps": sorted({step for _, _, step in answers})}


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--part", choices=["machinery", "sharding", "publish"], default="machinery")
    ap.add_argument("--long-tokens", type=int, default=384, help="publish: each long request's tokens")
    ap.add_argument("--settle", type=float, default=5.0, help="publish: seconds before the step is published")
    a = ap.parse_args()
    pin_threads(a.threads)
    if a.part != "machinery":
        out = asyncio.run(sharding(a) if a.part == "sharding" else publish(a))
        print(f"wrote {save_result(f'scale_{a.part}', out)}: {out}")
        return
    out = asyncio.run(main_async(a))
    path = save_result("scale", out)
    print(f"wrote {path}")
    for r in out["runs"]:
        print(f"{r['replicas']} replica(s), {r['trainers']} rank(s): {r['tokens_per_s']:.0f} tokens/s "
              f"(local {out['local_tokens_per_s']:.0f}), step {r['step_seconds']:.1f}s = ranks {r['ranks_seconds']:.1f}"
              f" + checkpoint {r['checkpoint_seconds']:.2f} + publish {r['publish_seconds']:.2f}; loss vs local "
              f"{r['loss_vs_local']:.1e}")


if __name__ == "__main__":
    main()
