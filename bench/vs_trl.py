"""artsdk's local backend against TRL's GRPOTrainer on the CPU: same model (with the same
LoRA), same prompt, group size, completion length and step count; wall time per step side
by side in one run.

    python -m bench.vs_trl [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--steps 3]

A step is: sample ``group`` completions of exactly ``tokens`` tokens for ``prompts`` prompts,
score them, one GRPO update. artsdk's step goes the whole way a user's does: HTTP to the
inference server, capture, the SQLite store, then ``run.train``. TRL needs ``pip install
trl==1.16.0 datasets`` (with torch==2.13.0 in the same command). Writes
bench/results/vs_trl.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import model_arguments, save_result

PROMPT = "Name a color, then say why you like it."
# an agent-like prompt: instructions and tool descriptions ahead of the question (--long-prompt)
LONG_PROMPT = ("You are a research assistant working in a company inbox. You can call these tools: "
               + " ".join(f"tool_{i}(query: string, limit: integer) searches the archive number {i} and "
                          "returns matching subjects, senders and dates;" for i in range(12))
               + " Always answer briefly. Question: name a color, then say why you like it.")


def reward_len(text: str) -> float:
    return -abs(len(text) - 40) / 40


def run_trl(a: argparse.Namespace, model_dir: str) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": a.prompt}]}] * (a.prompts * (a.steps + 1)))
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):  # noqa: ANN002, ANN003
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kwargs):  # noqa: ANN002, ANN003
            times.append(time.perf_counter() - self.t0)

    def reward(completions, **_):  # noqa: ANN001, ANN003
        return [reward_len(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.tokens, generation_kwargs={"min_new_tokens": a.tokens},
            max_steps=a.steps + 1, learning_rate=1e-4, beta=0.0, bf16=False, use_cpu=True,
            logging_steps=1, report_to=[], save_strategy="no", loss_type="dapo", temperature=1.0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                              processing_class=tok, callbacks=[Clock()],
                              peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                     task_type="CAUSAL_LM"))
        trainer.train()
    return times[1:]  # the first step warms up


async def run_artsdk(a: argparse.Namespace) -> list[float]:
    from openai import AsyncOpenAI

    import artsdk as art
    from backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as home:
        art.configure(store=f"{home}/store.db", home=home, progress=False)
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)

        @art.rollout
        async def answer(i: int) -> str:
            r = await client.chat.completions.create(
                model="bench", messages=[{"role": "user", "content": a.prompt}], max_tokens=a.tokens,
                extra_body={"min_tokens": a.tokens})
            return r.choices[0].message.content or ""

        @art.reward
        def length(t: art.Trajectory) -> float:
            return reward_len(t.outcome)

        be = LocalBackend(device="cpu", home=home)
        model = art.TrainableModel("bench", base_model=a.model, project="bench",
                                   config={"train": {"loss": "dapo", "learning_rate": 1e-4}})
        times = []
        async with art.session(model, backend=be) as run:
            for _ in range(a.steps + 1):
                t0 = time.perf_counter()
                groups = await art.gather(answer, range(a.prompts), group_size=a.group, rewards=[length])
                await run.train(groups)
                times.append(time.perf_counter() - t0)
        await be.close()
        return times[1:]


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--long-prompt", action="store_true", help="an agent-like prompt of ~400 tokens")
    a = ap.parse_args()
    a.prompt = LONG_PROMPT if a.long_prompt else PROMPT
    torch.set_num_threads(a.threads)
    from backends.local.models import resolve

    where, _ = resolve(a.model, Path(os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk"))
    ours = asyncio.run(run_artsdk(a))
    trl = run_trl(a, str(where))
    r = {"model": a.model, "prompts_per_step": a.prompts, "group_size": a.group, "tokens": a.tokens,
         "prompt": "agent-like, ~400 tokens" if a.long_prompt else "short (one sentence)",
         "steps": a.steps, "artsdk_seconds_per_step": statistics.median(ours),
         "trl_seconds_per_step": statistics.median(trl)}
    r["speedup"] = r["trl_seconds_per_step"] / r["artsdk_seconds_per_step"]
    save_result("vs_trl_long" if a.long_prompt else "vs_trl", r)
    print(f"{a.model}: artsdk {r['artsdk_seconds_per_step']:.2f} s/step, TRL GRPOTrainer "
          f"{r['trl_seconds_per_step']:.2f} s/step: artsdk is {r['speedup']:.2f}x TRL's speed")


if __name__ == "__main__":
    main()
