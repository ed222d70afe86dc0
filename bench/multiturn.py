"""What an agent's later turns cost: a conversation of 5 turns, each adding about 300 tokens
(a user turn of about 280 and an answer of 20), through the local backend's server over HTTP,
with the built-in engine's prefix cache on and off; turn k's time against turn 1's (medians
over several conversations), and the whole conversation's, in one run with threads pinned.

    python -m bench.multiturn [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--rollouts 4] [--threads 2]
    python -m bench.multiturn --engine vllm      # vLLM's prefix caching on and off, the same way

The answers are the same token for token with the cache on and off (checked here). Writes
bench/results/multiturn.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import torch
from openai import AsyncOpenAI

from bench.common import model_arguments, save_result

TURNS, ANSWER = 5, 20
FACTS = ("The river that runs by the old mill floods each spring, and the miller keeps a ledger of every "
         "flood, the height of the water, the day it rose and the day it fell, and what it carried away. ")


def user_turn(k: int) -> str:
    """About 280 tokens of new context (a tool's output, a long question)."""
    return f"Part {k} of the record. " + FACTS * 7 + "Summarise the new part in one sentence."


async def conversation(client: AsyncOpenAI, model: str, seed: int) -> tuple[list[float], list[list[int]]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You summarise records."}]
    times, answers = [], []
    for k in range(TURNS):
        messages.append({"role": "user", "content": user_turn(k)})
        t0 = time.perf_counter()
        r = await client.chat.completions.create(model=model, messages=messages, max_tokens=ANSWER, temperature=0,
                                                 seed=seed, extra_body={"min_tokens": ANSWER})
        times.append(time.perf_counter() - t0)
        answers.append(r.choices[0].model_extra["token_ids"])
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return times, answers


async def one_setting(base_model: str, cache_mb: int, rollouts: int, engine: str = "builtin") -> dict[str, Any]:
    import artsdk as art
    from backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as home:
        if engine == "vllm":  # vLLM's own prefix caching, on or off
            be = LocalBackend(device="cpu", home=home, engine="vllm", vllm={"prefix_caching": bool(cache_mb)})
        else:
            be = LocalBackend(device="cpu", home=home, prefix_cache_mb=cache_mb)
        endpoint = await be.register(art.TrainableModel("bench", base_model=base_model, project="bench"))
        client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        await conversation(client, "bench", -1)  # warm up (and, with the cache on, a conversation unlike the rest)
        turns: list[list[float]] = [[] for _ in range(TURNS)]
        totals, answers = [], []
        for i in range(rollouts):  # one at a time: each turn's time is its own
            times, said = await conversation(client, "bench", i)
            for k, t in enumerate(times):
                turns[k].append(t)
            totals.append(sum(times))
            answers.append(said)
        stats = be.models["bench"].engine.prefix_cache.stats if cache_mb and engine == "builtin" else None
        await client.close()
        await be.close()
    medians = [statistics.median(t) for t in turns]
    return {"turn_medians_s": medians, "turn_ratios": [m / medians[0] for m in medians],
            "rollout_median_s": statistics.median(totals), "answers": answers, "cache_stats": stats}


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    print(f"threads: {torch.get_num_threads()} (torch), model {a.model}", flush=True)
    off = await one_setting(a.model, 0, a.rollouts, a.engine)
    on = await one_setting(a.model, a.cache_mb, a.rollouts, a.engine)
    assert on["answers"] == off["answers"], "the prefix cache changed an answer"
    for name, r in (("cache off", off), ("cache on", on)):
        print(f"{name}: turn medians " + ", ".join(f"{m:.2f}" for m in r["turn_medians_s"])
              + f" s; turn {TURNS} / turn 1 = {r['turn_ratios'][-1]:.2f}; a whole conversation {r['rollout_median_s']:.1f} s")
    for r in (off, on):
        r.pop("answers")
    return {"model": a.model, "engine": a.engine, "threads": torch.get_num_threads(), "turns": TURNS, "answer_tokens": ANSWER,
            "rollouts": a.rollouts, "cache_off": off, "cache_on": on, "same_answers": True,
            "speedup_whole_rollout": off["rollout_median_s"] / on["rollout_median_s"]}


def main() -> None:
    ap = model_arguments(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--cache-mb", type=int, default=512)
    ap.add_argument("--engine", choices=["builtin", "vllm"], default="builtin")
    a = ap.parse_args()
    save_result("multiturn" + ("_vllm" if a.engine == "vllm" else ""), asyncio.run(main_async(a)))


if __name__ == "__main__":
    main()
