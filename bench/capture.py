"""Capture overhead: the same chat-completion and Responses API calls to a loopback server
with and without capture.

    python -m bench.capture [--calls 1000]

The server runs in its own process (on the other CPU) so it does not share this process's GIL.
Each captured call (a plain call of a rollout of one call: recorded, not stored) is timed right
beside an uncaptured one (artsdk's patches in place, outside a rollout; bench/paired.py), and
the overhead is the median of those differences. Writes bench/results/capture.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import artsdk as art
from bench.common import save_result
from bench.paired import pairs
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


def one_call(client: Any, stream: bool, api: str = "chat") -> Any:
    """One call of the kind measured, a stream read to its end."""
    if api == "responses":
        out = client.responses.create(model="m", input=MSGS[1:], instructions=MSGS[0]["content"], stream=stream)
    else:
        out = client.chat.completions.create(model="m", messages=MSGS, stream=stream)
    if stream:
        for _ in out:
            pass
    return out


def row(label: str, got: dict[str, list[float]]) -> dict:
    p, over = statistics.median(got["uncaptured"]), statistics.median(got["wall"])
    return {"case": label, "calls": len(got["wall"]), "uncaptured_ms": p * 1e3, "captured_ms": (p + over) * 1e3,
            "overhead_us": over * 1e6, "overhead_pct": 100 * over / p}


def measure(label: str, url: str, calls: int, stream: bool, api: str = "chat") -> dict:
    client = OpenAI(base_url=url, api_key="k", max_retries=0)
    plain = functools.partial(one_call, client, stream, api)
    captured = art.rollout(plain)  # a plain call of the rollout: records, does not store
    for _ in range(20):  # warm
        plain(), captured()
    return row(label, pairs(plain, captured, calls))


def async_measure(url: str, calls: int) -> dict:
    with asyncio.Runner() as runner:  # one event loop for every call, as an async agent has
        client = AsyncOpenAI(base_url=url, api_key="k", max_retries=0)

        async def plain() -> None:
            await client.chat.completions.create(model="m", messages=MSGS)

        captured = art.rollout(plain)
        for _ in range(20):
            runner.run(plain()), runner.run(captured())
        got = pairs(lambda: runner.run(plain()), lambda: runner.run(captured()), calls)
        runner.run(client.close())
    return row("async", got)


def turns_cost(url: str, calls: int, answers: str = "dicts", rounds: int = 20) -> list[dict]:
    """What capture adds to the call at turn 1, 2, 10 and 20 of a conversation, in place: the
    conversation's messages so far (two a turn: the answer and a new user message), sent with
    the rollout's recorder holding what its call before this one left there (the state the
    turn's call finds in a real rollout: those messages were copied then, only the two new ones
    are now), each such call timed right beside the same call made outside a rollout
    (bench/paired.py). ``answers``: how the agent keeps the answers -- as dicts it makes
    ("dicts"), as the response's own ``ChatCompletionMessage`` ("objects"), or as a Responses
    API agent does, the response's output items appended to its input ("responses"): turn 2 is
    the first to send one of those, and copies it. The turns take turns, ``rounds`` times, so
    that the machine's speed drifting (it does, by tens of percent over minutes) reaches all
    alike."""
    import contextvars

    from openai.types.chat import ChatCompletionMessage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    from artsdk.capture.context import Recorder, current_recorder

    def answer(i: int) -> Any:
        if answers == "objects":
            return ChatCompletionMessage(role="assistant", content="Paris")
        if answers == "responses":
            return ResponseOutputMessage(id=f"msg_{i}", type="message", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text="Paris",
                                                                     annotations=[])])
        return {"role": "assistant", "content": "Paris"}

    client = OpenAI(base_url=url, api_key="k", max_retries=0)
    cases = {}
    for turn in (1, 2, 10, 20):
        messages = [{"role": "user", "content": f"turn {i // 2 + 1}: what is the capital of France? one word please"}
                    if i % 2 == 0 else answer(i) for i in range(2 * turn - 1)]
        if answers == "responses":
            sent = "input"
            call = functools.partial(client.responses.create, model="m", input=messages,
                                     instructions=MSGS[0]["content"])
        else:
            sent = "messages"
            call = functools.partial(client.chat.completions.create, model="m", messages=[dict(MSGS[0]), *messages])
        rec = Recorder()
        inside = contextvars.copy_context()
        inside.run(current_recorder.set, rec)
        if turn > 1:  # the turn before: its messages are copied now, as they were in the rollout
            inside.run(functools.partial(call, **{sent: call.keywords[sent][:-2]}))
        # what the call of the turn before left: the recorder's entries, and how long each list in
        # them was (the calls add to those lists in place: prefix.py)
        left = {key: (kept, [len(x) if type(x) is list else None for x in kept]) for key, kept in rec.copies.items()}

        def captured(rec: Recorder = rec, left: dict = left, inside: Any = inside, call: Any = call) -> None:
            rec.copies.clear()  # as the call of the turn before left it: what this one added cut off
            for key, (kept, lengths) in left.items():
                rec.copies[key] = kept
                for x, length in zip(kept, lengths):
                    if length is not None:
                        del x[length:]
            del rec.calls[1:]  # (a real conversation's recorder holds a call a turn, not one a pair)
            inside.run(call)

        cases[turn] = (len(messages) + 1, call, captured)
    got: dict[int, dict[str, list[float]]] = {turn: {"wall": [], "cpu": [], "uncaptured": [], "rounds": [],
                                                     "recording": []} for turn in cases}
    with recording_timed() as spent:
        for _ in range(rounds):
            for turn, (_, call, captured) in cases.items():
                spent.clear()
                got_now = pairs(call, captured, max(1, calls // rounds))
                for clock in ("wall", "cpu", "uncaptured"):
                    got[turn][clock] += got_now[clock]
                got[turn]["rounds"].append(statistics.median(got_now["wall"]))
                got[turn]["recording"] += spent
    rows = []
    kept = {"dicts": "", "objects": ", the answers the response's objects",
            "responses": ", Responses API, the output items appended"}[answers]
    for turn, (size, _, _) in cases.items():
        g = got[turn]
        rows.append({"case": f"turn {turn} of a conversation ({size} messages{kept}), in place", "turn": turn,
                     "answers": answers, "overhead_us": statistics.median(g["wall"]) * 1e6,
                     "cpu_us": statistics.median(g["cpu"]) * 1e6,
                     # the spread of the rounds' own medians, as a standard error of the overhead
                     "se_us": statistics.stdev(g["rounds"]) / len(g["rounds"]) ** 0.5 * 1e6,
                     "call_ms": statistics.median(g["uncaptured"]) * 1e3,
                     "recording_us": statistics.median(g["recording"]) * 1e6})
        for key in ("overhead_us", "recording_us"):
            rows[-1][f"{key.removesuffix('_us')}_vs_turn_1"] = rows[-1][key] / rows[0][key]
    return rows


@contextlib.contextmanager
def recording_timed() -> Any:
    """The time each captured call spends on its record, timed in place, inside the call: the
    request read as it goes out (``one_call``'s entry: the messages copied or reused) and the
    response recorded (the patched call's ``_record``: the response read, the call built). A
    list the calls add to, one sum a call."""
    from artsdk.capture import context, openai_patch

    spent: list[float] = []
    entering: list[float] = []
    record, enter = openai_patch._record, context.one_call.__enter__

    def timed_enter(self: Any) -> Any:
        t0 = time.perf_counter()
        got = enter(self)
        if self.rec is not None:  # (a call outside a rollout records nothing)
            entering.append(time.perf_counter() - t0)
        return got

    def timed(*args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        record(*args, **kwargs)
        spent.append(time.perf_counter() - t0 + (entering.pop() if entering else 0.0))

    openai_patch._record, context.one_call.__enter__ = timed, timed_enter  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        openai_patch._record, context.one_call.__enter__ = record, enter  # type: ignore[method-assign]
        entering.clear()


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
    (the agent appending to its list, as agents do), answered whole and streamed (four chunks),
    and answered whole with every other message the response's own ``ChatCompletionMessage``
    (as an agent that appends ``response.choices[0].message`` keeps them): the work alone, no
    network; the best of 5 runs of ``n`` calls each."""
    import timeit

    from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage

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

    def whole(messages: list[Any]) -> None:
        from_response("openai", {"model": "m", "messages": messages}, resp, 0.0)

    def said(i: int, objects: bool) -> Any:
        content = f"turn {i}: " + "words " * 30
        if i % 2 == 0:
            return {"role": "user", "content": content}
        return ChatCompletionMessage(role="assistant", content=content) if objects else \
            {"role": "assistant", "content": content}

    rows = []
    for kind, record, objects in (("call", whole, False), ("streamed call", streamed, False), ("call", whole, True)):
        first = len(rows)
        for size in (1, 10, 50):
            messages = [said(i, objects) for i in range(size)]
            token = current_recorder.set(Recorder())
            try:
                record(messages)  # the conversation so far
                best = min(timeit.repeat(lambda: record(messages), number=n, repeat=5))
            finally:
                current_recorder.reset(token)
            answers = ", the answers the response's objects" if objects else ""
            rows.append({"case": f"record a {kind} of {size} message(s){answers}", "messages": size,
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
    ap.add_argument("--calls", type=int, default=1000, help="pairs of calls of each kind (half as many streamed)")
    a = ap.parse_args()
    proc, url = start_server()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:  # the server on one CPU, this client on another
        os.sched_setaffinity(proc.pid, set(cpus[1:]))
        os.sched_setaffinity(0, {cpus[0]})
    capture.install()
    try:
        rows = [measure("sync", url, a.calls, stream=False),
                async_measure(url, a.calls),
                measure("sync stream", url, a.calls // 2, stream=True),
                measure("responses", url, a.calls, stream=False, api="responses"),
                measure("responses stream", url, a.calls // 2, stream=True, api="responses"),
                *turns_cost(url, a.calls), *turns_cost(url, a.calls, "objects"),
                *turns_cost(url, a.calls, "responses"),
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
