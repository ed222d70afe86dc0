"""Training throughput: one GRPO step of the local backend (one update) next to a bare
PyTorch forward + backward + optimizer step over the very same packed rows, with the same
segment-by-segment attention and row budget, logits where the step computes them (the
like-for-like limit: what the step costs without its GRPO bookkeeping); and next to a plain
causal-LM loss over one long row, logits at every position (a reference, not a limit).

    python -m bench.train_throughput [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--groups 4] [--threads 2]

Trajectories have mixed lengths (prompts 40-240 tokens, completions 8-120), as agent
trajectories do. Also reports the padding a one-padded-row-per-trajectory batch would carry
next to artsdk's packed rows (which carry none). Threads are pinned (``--threads``, printed).
Writes bench/results/train_throughput.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import anyio
import torch

import artsdk as art
from bench.common import local_model, model_arguments, save_result
from artsdk.testing import trajectory
from backends.local.attention import packed_attention
from backends.local.batch import advantages, pack, segments
from backends.local.trainer import token_logprobs


def make_groups(n_groups: int, group_size: int, vocab: int, seed: int = 0) -> list[art.Group]:
    rng = random.Random(seed)
    groups = []
    for _ in range(n_groups):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(40, 240))]
        trajs = []
        for k in range(group_size):
            n = rng.randint(8, 120)
            t = trajectory([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                           token_ids=[rng.randrange(vocab) for _ in range(n)], logprobs=[-2.0] * n,
                           model="bench")
            t.calls[0].prompt_token_ids = prompt
            t.reward = float(k % 2) + rng.random() * 0.1
            trajs.append(t)
        groups.append(art.Group(trajectories=trajs))
    return groups


def bare_step(served, groups, budget: int, like_for_like: bool) -> float:
    """Forward + backward of the packed rows with a plain loss, and the optimizer step; nothing
    else. ``like_for_like``: the step's own rows (its budget), its segment-by-segment attention,
    logits only at the trained positions -- the limit. Otherwise: one long row, the model's own
    attention, logits at every position, as a plain causal-LM loss computes them."""
    scored, _ = advantages(groups, scale=True)
    rows = pack([segments(t, a, served.tokenizing()).segments for t, a in scored], budget)
    model = served.model
    model.set_adapter("policy")
    model.train()
    t0 = time.perf_counter()
    with packed_attention(model) if like_for_like else _nothing():
        for row in rows:
            ids = torch.tensor([x for s in row for x in s.tokens])
            pos = torch.tensor([p for s in row for p in range(len(s.tokens))])
            keep = None
            if like_for_like:
                trained = torch.tensor([t for s in row for t in s.trained])
                keep = torch.nonzero(trained[1:] & (pos[1:] > 0))[:, 0]
            (-token_logprobs(model, ids, pos, keep).mean()).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    served.optimizer.step()
    served.optimizer.zero_grad(set_to_none=True)
    model.eval()
    return time.perf_counter() - t0


def _nothing():
    import contextlib

    return contextlib.nullcontext()


async def main_async(a: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    print(f"threads: {torch.get_num_threads()} (torch)", flush=True)
    budget = 256  # the step's row budget on the CPU (TrainConfig.tokens_per_row), given to both
    with tempfile.TemporaryDirectory() as home:
        be, model, _ = await local_model(a.model, home)
        served = be.models["bench"]
        groups = make_groups(a.groups, a.group_size, vocab=len(served.tokenizer))
        ours, calls, bare, full, tokens = [], [], [], [], 0
        for i in range(a.repeat + 1):  # the first round warms up
            # every other round the limit goes first: what runs second in a round is not favoured
            b = bare_step(served, groups, budget, like_for_like=True) if i % 2 else None
            t0 = time.perf_counter()
            res = await be.train(model, groups, minibatches=1, tokens_per_row=budget)  # one update, as the limit
            call = time.perf_counter() - t0
            if b is None:
                b = bare_step(served, groups, budget, like_for_like=True)
            f = bare_step(served, groups, 2048, like_for_like=False)
            if i:
                ours.append(res.metrics["seconds"])
                calls.append(call)
                bare.append(b)
                full.append(f)
            tokens = res.metrics["tokens_total"]
            trained = res.metrics["tokens_trained"]
        await be.close()
    lengths = [len(t.calls[0].prompt_token_ids) + len(t.calls[0].choices[0].token_ids)
               for g in groups for t in g]
    padded = len(lengths) * max(lengths)
    o, b, f = statistics.median(ours), statistics.median(bare), statistics.median(full)
    return {
        "model": a.model, "threads": a.threads, "limit": "like-for-like", "trajectories": len(lengths),
        "tokens_per_step": tokens,
        "trained_tokens_per_step": trained,
        "artsdk_seconds": o, "bare_seconds": b,
        # the whole train() call: the step plus writing the checkpoint and publishing the adapter
        "artsdk_call_seconds": statistics.median(calls),
        "artsdk_tokens_per_s": tokens / o, "bare_tokens_per_s": tokens / b, "ratio": b / o,
        # each round's own ratio (the limit and the step measured back to back): their spread
        "ratios": [bb / oo for bb, oo in zip(bare, ours)],
        "ratio_sd": statistics.stdev([bb / oo for bb, oo in zip(bare, ours)]) if len(ours) > 1 else 0.0,
        "bare_full_logits_seconds": f, "bare_full_logits_tokens_per_s": tokens / f, "ratio_full_logits": f / o,
        "padding_waste_packed": 0.0, "padding_waste_one_row_per_trajectory": 1 - sum(lengths) / padded,
    }


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    r = anyio.run(main_async, a)
    save_result("train_throughput" + ("_tiny" if a.model == "tiny" else ""), r)
    print(f"{r['model']}: {r['tokens_per_step']:.0f} tokens/step ({r['trained_tokens_per_step']:.0f} trained); "
          f"artsdk {r['artsdk_tokens_per_s']:.0f} tok/s, bare fwd+bwd {r['bare_tokens_per_s']:.0f} tok/s "
          f"(ratio {r['ratio']:.2f} ± {r['ratio_sd']:.2f} over {len(r['ratios'])} rounds), bare with full logits {r['bare_full_logits_tokens_per_s']:.0f} tok/s "
          f"(ratio {r['ratio_full_logits']:.2f}); padding waste packed 0%, one row per trajectory "
          f"{100 * r['padding_waste_one_row_per_trajectory']:.0f}%")


if __name__ == "__main__":
    main()
