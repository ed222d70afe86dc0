"""A captured call leaves nothing for the garbage collector that the same call uncaptured does
not: what capture attaches to a stream or a response is let go of by reference counting when
the agent drops it. Otherwise every captured stream (its response, its chunks, the recording)
waits for a collection, which then runs every few calls and moves survivors into the older
generations, whose full collections walk the whole heap. Real clients against the real HTTP
server on 127.0.0.1; what is left over is counted with the collector's DEBUG_SAVEALL, and
captured may leave at most one object a call more than uncaptured (the leaks this guards
against left 100 to 170)."""

import asyncio
import concurrent.futures
import functools
import gc

import pytest

import artsdk as art

CALLS = 6
MSGS = [{"role": "user", "content": "a b c"}]


def left_for_the_collector(call, rounds: int = 3, settle=lambda: None) -> float:
    """Objects per call that only the garbage collector frees, after ``call()`` is made
    ``CALLS`` times (the first two, which build the client's caches, not counted): the fewest
    of ``rounds`` rounds. The collector sees the whole process, and another thread of it (the
    mock server's, or one an earlier test left running) can leave cycles of its own in a round;
    a cycle of capture's is there in every round. ``settle()`` waits for the work the calls
    handed to other threads, before each collection."""
    call()
    call()
    return min(_one_round(call, settle) for _ in range(rounds))


def _one_round(call, settle) -> float:
    settle()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(CALLS):
            call()
        settle()
        gc.collect()
        return len(gc.garbage) / CALLS
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def drain(stream) -> None:
    for _ in stream:
        pass


def cases(base_url: str) -> dict:
    from openai import AsyncOpenAI, OpenAI

    sync = OpenAI(base_url=base_url, api_key="k", max_retries=0)

    def async_stream() -> None:
        async def go() -> None:
            client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
            s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
            async for _ in s:
                pass
            await client.close()
        asyncio.run(go())

    def left_early() -> None:
        for _ in sync.chat.completions.create(model="m", messages=MSGS, stream=True):
            break

    def streaming_response() -> None:
        with sync.chat.completions.with_streaming_response.create(model="m", messages=MSGS) as r:
            r.parse()

    return {
        "chat stream": lambda: drain(sync.chat.completions.create(model="m", messages=MSGS, stream=True)),
        "chat stream left early": left_early,
        "chat stream, async": async_stream,
        "chat with_streaming_response": streaming_response,
        "responses stream": lambda: drain(sync.responses.create(model="m", input="a b", stream=True)),
        "anthropic stream": lambda: drain(_anthropic(base_url).messages.create(model="m", max_tokens=20, messages=MSGS,
                                                                             stream=True)),
    }


@functools.cache
def _anthropic(base_url: str):
    """One client a server (``importorskip``: only the test that asks for it is skipped without it)."""
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="k", max_retries=0)


@pytest.mark.parametrize("name", ["chat stream", "chat stream left early", "chat stream, async",
                                  "chat with_streaming_response", "responses stream", "anthropic stream"])
def test_a_captured_call_leaves_no_cycle(server, name):
    call = cases(server.base_url)[name]
    uncaptured = left_for_the_collector(call)
    captured = left_for_the_collector(art.rollout(name="agent")(call))
    # (the mock server answers in a thread of this process: a stray object of its own is not a cycle of capture's,
    # which left 100 to 170 a call)
    assert captured - uncaptured <= 1, f"{name}: {captured:g} objects a call left to the collector (uncaptured: {uncaptured:g})"


def test_a_captured_litellm_stream_adds_next_to_nothing_to_litellm_own_cycles(server, monkeypatch):
    """litellm's streams are in reference cycles of their own; what capture hangs on one (its
    StreamWatch) keeps none of the recording there with it."""
    litellm = pytest.importorskip("litellm")

    def call() -> None:
        drain(litellm.completion(model="openai/m", api_base=server.base_url, api_key="k", messages=MSGS,
                                 stream=True))

    settle = _waiting_for_litellm_logging(monkeypatch)
    uncaptured = left_for_the_collector(call, settle=settle)
    captured = left_for_the_collector(art.rollout(name="agent")(call), settle=settle)
    assert captured - uncaptured <= 2, f"{captured:g} objects a call left to the collector (uncaptured: {uncaptured:g})"


def _waiting_for_litellm_logging(monkeypatch):
    """litellm hands every streamed chunk and every finished call to its logging threads (a pool
    of up to 100), whose cycles (about 200 objects a call) land in a round or in the next one as
    those threads happen to run: rounds of the same calls differed by 33 objects a call, or 66.
    Its pool's ``submit`` is wrapped to keep each task's future, and to let go of the task's
    arguments before the future is done; the function returned waits for every task so far."""
    from litellm.litellm_core_utils.thread_pool_executor import executor

    submit = executor.submit
    handed: list[concurrent.futures.Future] = []

    def submit_kept(fn, /, *args, **kwargs):
        task = [fn, args, kwargs]

        def run():
            fn, args, kwargs = task
            task.clear()
            return fn(*args, **kwargs)

        handed.append(submit(run))
        return handed[-1]

    monkeypatch.setattr(executor, "submit", submit_kept)

    def settle() -> None:
        concurrent.futures.wait(handed)
        handed.clear()

    return settle
