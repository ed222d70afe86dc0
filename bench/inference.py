"""Inference throughput of the local backend's server: generated tokens/s for 1, 4 and 16
concurrent requests over HTTP, next to Hugging Face ``generate`` on the same batch
in-process (the limit), same model, same prompt and token counts.

    python -m bench.inference [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--tokens 32]

Every answer is exactly ``--tokens`` long (``min_tokens`` on the server, ``min_new_tokens``
for generate), so both sides produce the same number of tokens. Writes
bench/results/inference.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch
from openai import AsyncOpenAI

from bench.common import local_model, model_arguments, save_result

PROMPT = [{"role": "user", "content": "Tell me a short story about a robot learning to play chess."}]


async def serve_rate(client: AsyncOpenAI, model: str, concurrent: int, tokens: int) -> float:
    async def one() -> int:
        r = await client.chat.completions.create(model=model, messages=PROMPT, max_tokens=tokens,
                                                 extra_body={"min_tokens": tokens})
        return len(r.choices[0].model_extra["token_ids"])

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(concurrent)))
    return sum(counts) / (time.perf_counter() - t0)


def generate_rate(served, batch: int, tokens: int) -> float:
    ids = torch.tensor([served.chat.prompt_ids(PROMPT)] * batch)
    model = served.model
    with torch.no_grad(), model.disable_adapter():
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=True, pad_token_id=served.tokenizer.pad_token_id)
        dt = time.perf_counter() - t0
    return (out.shape[1] - ids.shape[1]) * batch / dt


async def main_async(a: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as home:
        be, model, endpoint = await local_model(a.model, home)
        served = be.models["bench"]
        client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        await serve_rate(client, "bench", 2, 4)  # warm up
        generate_rate(served, 2, 4)
        rows = []
        for n in (1, 4, 16):
            s = max([await serve_rate(client, "bench", n, a.tokens) for _ in range(a.repeat)])
            g = max(generate_rate(served, n, a.tokens) for _ in range(a.repeat))
            rows.append({"concurrent": n, "server_tokens_per_s": s, "generate_tokens_per_s": g, "ratio": s / g})
            print(f"{n:>2} concurrent: server {s:7.1f} tok/s, HF generate {g:7.1f} tok/s, ratio {s / g:.2f}",
                  flush=True)
        await client.close()
        await be.close()
    scale = rows[-1]["server_tokens_per_s"] / rows[0]["server_tokens_per_s"]
    print(f"16 concurrent / 1 request: {scale:.1f}x")
    return {"model": a.model, "tokens_per_answer": a.tokens, "rows": rows, "scale_16_over_1": scale}


def main() -> None:
    ap = model_arguments()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    r = asyncio.run(main_async(a))
    save_result("inference", r)


if __name__ == "__main__":
    main()
