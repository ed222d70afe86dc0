"""Capture overhead: the same chat-completion and Responses API calls to a loopback server
with and without capture.

    python -m bench.capture [--calls 2000]

The server runs in its own process so it does not share this process's GIL. Blocks of
calls alternate between "uncaptured" (artsdk's patches removed) and "captured" (inside a
rollout, every call recorded) so machine noise hits both alike; the median block time per
call is compared. Writes bench/results/capture.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import artsdk as art
from bench.common import save_result
from artsdk import capture
from openai import AsyncOpenAI, OpenAI

MSGS = [{"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "what is the capital of France? answer in one word please"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "artsdk.testing.mock_server", str(port)], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    client = OpenAI(base_url=url, api_key="k", max_retries=0)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.chat.completions.create(model="m", messages=MSGS)
            return proc, url
        except Exception:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)


def sync_block(client: OpenAI, n: int, stream: bool, api: str = "chat") -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        if api == "responses":
            out = client.responses.create(model="m", input=MSGS[1:], instructions=MSGS[0]["content"], stream=stream)
        else:
            out = client.chat.completions.create(model="m", messages=MSGS, stream=stream)
        if stream:
            for _ in out:
                pass
    return (time.perf_counter() - t0) / n


def measure(label: str, url: str, calls: int, block: int, stream: bool, api: str = "chat") -> dict:
    client = OpenAI(base_url=url, api_key="k", max_retries=0)
    rec_block = art.rollout(lambda n: sync_block(client, n, stream, api))
    plain, captured = [], []
    for _ in range(max(1, calls // (2 * block))):
        capture.uninstall()
        plain.append(sync_block(client, block, stream, api))
        capture.install()
        captured.append(rec_block(block))  # a plain call of the rollout: records, does not store
    p, c = statistics.median(plain), statistics.median(captured)
    return {"case": label, "calls": calls, "uncaptured_ms": p * 1e3, "captured_ms": c * 1e3,
            "overhead_us": (c - p) * 1e6, "overhead_pct": 100 * (c - p) / p}


async def async_measure(url: str, calls: int, block: int) -> dict:
    client = AsyncOpenAI(base_url=url, api_key="k", max_retries=0)

    async def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await client.chat.completions.create(model="m", messages=MSGS)
        return (time.perf_counter() - t0) / n

    rec = art.rollout(run)
    plain, captured = [], []
    for _ in range(max(1, calls // (2 * block))):
        capture.uninstall()
        plain.append(await run(block))
        capture.install()
        captured.append(await rec(block))
    await client.close()
    p, c = statistics.median(plain), statistics.median(captured)
    return {"case": "async", "calls": calls, "uncaptured_ms": p * 1e3, "captured_ms": c * 1e3,
            "overhead_us": (c - p) * 1e6, "overhead_pct": 100 * (c - p) / p}


def direct_cost(n: int = 3000) -> dict:
    """The recording work alone, with no network: how long turning one response into a
    stored-ready LLMCall takes (the floor under the per-call overhead)."""
    from openai.types.chat import ChatCompletion

    from artsdk.capture.record import from_response

    resp = ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m@1",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Paris is the capital."},
                     "logprobs": {"content": [{"token": "t", "logprob": -0.5, "bytes": None,
                                               "top_logprobs": []}] * 24},
                     "token_ids": list(range(24))}],
    })
    kwargs = {"model": "m", "messages": MSGS}
    t0 = time.perf_counter()
    for _ in range(n):
        from_response("openai", kwargs, resp, 0.0)
    return {"case": "record only (no I/O)", "overhead_us": (time.perf_counter() - t0) / n * 1e6}


def conversation_cost(n: int = 3000) -> list[dict]:
    """Recording one call of a growing conversation inside a rollout, at 1, 10 and 50 messages
    (the agent appending to its list, as agents do), answered whole and streamed (four chunks):
    the work alone, no network; the best of 5 runs of ``n`` calls each."""
    import timeit

    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from artsdk.capture.context import Recorder, current_recorder
    from artsdk.capture.record import StreamAccumulator, from_response

    resp = ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m@1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Paris."},
                     "token_ids": list(range(24))}]})
    chunks = [ChatCompletionChunk.model_validate({
        "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m@1",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": word} if word else {},
                     "finish_reason": None if word else "stop"}]}) for word in ("Par", "is", ".", "")]

    def streamed(messages: list[dict]) -> None:
        acc = StreamAccumulator("openai", {"model": "m", "messages": messages, "stream": True})
        for chunk in chunks:
            acc.add(chunk)
        acc.to_call(0.0, False)

    rows = []
    for kind, record in (("call", lambda m: from_response("openai", {"model": "m", "messages": m}, resp, 0.0)),
                         ("streamed call", streamed)):
        first = len(rows)
        for size in (1, 10, 50):
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "words " * 30}
                        for i in range(size)]
            token = current_recorder.set(Recorder())
            try:
                record(messages)  # the conversation so far
                best = min(timeit.repeat(lambda: record(messages), number=n, repeat=5))
            finally:
                current_recorder.reset(token)
            rows.append({"case": f"record a {kind} of {size} message(s)", "messages": size,
                         "overhead_us": best / n * 1e6})
        for r in rows[first:]:
            r["vs_one_message"] = r["overhead_us"] / rows[first]["overhead_us"]
    return rows


def direct_cost_responses(n: int = 3000) -> dict:
    """The same for a Responses API answer (items to the chat view, and the items kept)."""
    from openai._models import construct_type
    from openai.types.responses import Response

    from artsdk.capture.responses_record import from_response as from_responses_response

    resp = construct_type(type_=Response, value={
        "id": "resp_x", "object": "response", "created_at": 0, "model": "m@1", "status": "completed",
        "output": [{"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "Paris is the capital.", "annotations": []}]}],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "token_ids": list(range(24)), "logprobs": [-0.5] * 24})
    kwargs = {"model": "m", "input": MSGS[1:], "instructions": MSGS[0]["content"]}
    t0 = time.perf_counter()
    for _ in range(n):
        from_responses_response("openai-responses", kwargs, resp, 0.0)
    return {"case": "responses record only (no I/O)", "overhead_us": (time.perf_counter() - t0) / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--block", type=int, default=50)
    a = ap.parse_args()
    proc, url = start_server()
    try:
        rows = [measure("sync", url, a.calls, a.block, stream=False),
                asyncio.run(async_measure(url, a.calls, a.block)),
                measure("sync stream", url, a.calls // 2, a.block, stream=True),
                measure("responses", url, a.calls, a.block, stream=False, api="responses"),
                measure("responses stream", url, a.calls // 2, a.block, stream=True, api="responses"),
                direct_cost(), direct_cost_responses(), *conversation_cost()]
    finally:
        proc.terminate()
        proc.wait(10)
    save_result("capture", {"cpu_count": os.cpu_count(), "rows": rows})
    for r in rows:
        if "uncaptured_ms" in r:
            print(f"{r['case']:12} uncaptured {r['uncaptured_ms']:.3f} ms/call  captured "
                  f"{r['captured_ms']:.3f} ms/call  overhead {r['overhead_us']:+.0f} us "
                  f"({r['overhead_pct']:+.1f}%)")
        else:
            print(f"{r['case']:12} {r['overhead_us']:.1f} us/call")


if __name__ == "__main__":
    main()
