"""Capture of litellm calls against a real HTTP server on 127.0.0.1."""

import json
import subprocess
import sys

import pytest

import artsdk as art
from tests.while_waiting import WAITING, changed_while_waiting

pytestmark = pytest.mark.anyio

litellm = pytest.importorskip("litellm")

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                                                                              "properties": {}}}}]


@pytest.fixture
def kw(server):
    return {"model": "openai/m", "api_base": server.base_url, "api_key": "k"}


def user(text):
    return [{"role": "user", "content": text}]


def test_completion_recorded_once(kw):
    @art.rollout
    def agent(q):
        r = litellm.completion(messages=user(q), logprobs=True, **kw)
        return r.choices[0].message.content

    t = agent.collect_sync("hi")
    assert t.outcome == "echo: hi"
    (call,) = t.calls  # litellm drives the openai client underneath: still one call
    assert call.provider == "litellm" and call.model == "openai/m"
    assert call.message["content"] == "echo: hi"
    assert call.choices[0].logprobs == [-0.5] * len("echo: hi")
    assert "api_key" not in call.params and "api_base" not in call.params
    assert call.served_by == "m@0" and call.step == 0
    assert call.choices[0].token_ids == [ord(c) for c in "echo: hi"] and call.choices[0].trainable


def test_positional_model_and_from_import(kw):
    from litellm import completion  # bound after artsdk patched litellm at import

    @art.rollout
    def agent():
        a = completion(kw["model"], user("pos"), api_base=kw["api_base"], api_key="k")
        return a.choices[0].message.content

    t = agent.collect_sync()
    assert t.outcome == "echo: pos" and t.calls[0].model == "openai/m"


async def test_acompletion_and_async_stream(kw):
    @art.rollout
    async def agent():
        r = await litellm.acompletion(messages=user("async"), **kw)
        s = await litellm.acompletion(messages=user("s t u"), stream=True, **kw)
        text = "".join([c.choices[0].delta.content or "" async for c in s])
        return r.choices[0].message.content, text

    t = await agent.collect()
    assert t.outcome == ("echo: async", "echo: s t u")
    plain, streamed = t.calls
    assert plain.message["content"] == "echo: async"
    assert streamed.stream and not streamed.incomplete
    assert streamed.message["content"] == "echo: s t u"
    assert streamed.served_by == "m@0"
    assert streamed.choices[0].token_ids == [ord(c) for c in "echo: s t u"]


def test_sync_stream_full_and_abandoned(kw):
    @art.rollout
    def agent():
        s = litellm.completion(messages=user("a b"), stream=True, **kw)
        full = "".join(c.choices[0].delta.content or "" for c in s)
        s2 = litellm.completion(messages=user("c d e f"), stream=True, **kw)
        for _ in s2:
            break
        return full

    t = agent.collect_sync()
    assert t.outcome == "echo: a b"
    assert not t.calls[0].incomplete and t.calls[0].message["content"] == "echo: a b"
    assert t.calls[0].choices[0].token_ids == [ord(c) for c in "echo: a b"]
    assert t.calls[0].choices[0].trainable
    assert t.calls[1].incomplete


def test_tool_calls(kw):
    @art.rollout
    def agent():
        r = litellm.completion(messages=user("tool please"), tools=TOOLS, **kw)
        s = litellm.completion(messages=user("tool please 2"), tools=TOOLS, stream=True, **kw)
        for _ in s:
            pass
        return r.choices[0].message.tool_calls[0].function.name

    t = agent.collect_sync()
    assert t.outcome == "lookup"
    for call, q in zip(t.calls, ("tool please", "tool please 2")):
        (tc,) = call.message["tool_calls"]
        assert tc["function"]["name"] == "lookup"
        assert json.loads(tc["function"]["arguments"]) == {"q": q}


def test_import_artsdk_does_not_import_litellm_or_torch():
    code = ("import sys, artsdk; bad = [m for m in ('litellm', 'torch', 'transformers', 'pytest', "
            "'hypothesis', 'openai') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


async def test_responses_and_aresponses_plain_and_streamed(kw):
    @art.rollout
    async def agent():
        plain = await litellm.aresponses(input="one", **kw)
        stream = await litellm.aresponses(input="two words", stream=True, **kw)
        text = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
        tool = await litellm.aresponses(input="tool please", tools=[{"type": "function", "name": "lookup",
                                                                      "parameters": {"type": "object"}}], **kw)
        return plain.output[0].content[0].text, text, tool.output[0].name

    t = await agent.collect()
    assert t.outcome == ("echo: one", "echo: two words", "lookup")
    assert [c.provider for c in t.calls] == ["litellm-responses"] * 3  # once each, not again by openai's patch
    assert [c.stream for c in t.calls] == [False, True, False] and not any(c.incomplete for c in t.calls)
    assert [c.choices[0].message["content"] for c in t.calls[:2]] == ["echo: one", "echo: two words"]
    assert t.calls[2].choices[0].message["tool_calls"][0]["function"]["name"] == "lookup"
    assert all(c.choices[0].trainable and c.served_by == "m@0" for c in t.calls)


def test_sync_responses_in_a_session_is_routed(server, art_store):
    from artsdk.testing.mock_server import MockServer
    from tests.test_session_config import ScriptedBackend

    @art.rollout
    def agent():
        return litellm.responses(model="ttt", input="hi", api_key="user-key").output[0].content[0].text

    import anyio

    async def run():
        with MockServer() as backend_server:
            async with art.session(art.TrainableModel("ttt", base_model="tiny"), backend=ScriptedBackend(backend_server)):
                t = await anyio.to_thread.run_sync(agent.collect_sync)
            assert backend_server.requests[-1]["api"] == "responses"
        return t

    t = anyio.run(run)
    assert t.outcome == "echo: hi" and t.calls[0].served_by == "ttt@0" and t.calls[0].choices[0].trainable


async def test_a_call_a_litellm_callback_makes_is_a_call_of_its_own(kw, async_client, sync_client):
    """litellm runs its callbacks after the call, from a thread or from its logging worker's
    task, in a context copied while the patched call still ran: a call one made was sent as
    the patched call's own inner request -- unrecorded, unrouted, unreported."""
    import asyncio

    from artsdk.capture import current_recorder

    def answered():  # calls of the running rollout that have their answer
        return sum(c is not None for c in current_recorder.get().calls)

    async def judge(kwargs, response, start, end):  # an async callback, run by litellm's logging worker
        asked = kwargs["messages"][0]["content"]
        if asked.startswith("q"):
            await async_client.chat.completions.create(model="m", messages=user(f"judge {asked}"))

    def note(kwargs, response, start, end):  # a sync one, run on litellm's thread pool
        asked = kwargs["messages"][0]["content"]
        if asked.startswith("s"):
            sync_client.chat.completions.create(model="m", messages=user(f"note {asked}"))

    @art.rollout
    async def agent(q):
        r = await litellm.acompletion(messages=user(q), **kw)
        for _ in range(100):  # the callback runs after the answer: wait for it, as a rollout would for a judge
            if answered() > 1:
                break
            await asyncio.sleep(0.05)
        return r.choices[0].message.content

    @art.rollout
    def sync_agent(q):
        import time

        r = litellm.completion(messages=user(q), **kw)
        for _ in range(100):
            if answered() > 1:
                break
            time.sleep(0.05)
        return r.choices[0].message.content

    saved = litellm.success_callback
    litellm.success_callback = [judge, note]
    try:
        many = await asyncio.gather(*(agent.collect(f"q{i}") for i in range(3)))  # each judged on its own rollout
        alone = await sync_agent.collect("s0")
    finally:
        litellm.success_callback = saved
    for i, t in enumerate(many):
        assert [c.messages[0]["content"] for c in t.calls] == [f"q{i}", f"judge q{i}"], t.warnings
        assert [c.provider for c in t.calls] == ["litellm", "openai"] and not t.warnings
    assert [c.messages[0]["content"] for c in alone.calls] == ["s0", "note s0"] and not alone.warnings


async def test_a_stream_a_task_reads_on_after_its_rollout_ended_is_read_whole_and_recorded_as_it_stood(kw):
    """The rollout returns while a task it left running waits for the stream's next chunk: the
    task still reads the stream to its end, and the call stays as it was when the rollout
    ended."""
    import asyncio

    tasks = []

    async def read_on(stream):
        return "".join([c.choices[0].delta.content or "" async for c in stream])

    @art.rollout
    async def agent():
        s = await litellm.acompletion(messages=user("slow stream 0.3 a b c"), stream=True, **kw)
        first = [(await s.__anext__()).choices[0].delta.content or "" for _ in range(2)]
        tasks.append(asyncio.create_task(read_on(s)))  # not awaited: it waits on the server's next chunk
        await asyncio.sleep(0.05)
        return "".join(first)

    t = await agent.collect()
    (call,) = t.calls
    as_recorded = call.model_dump()
    assert call.incomplete and call.message["content"] == t.outcome == "echo:"
    rest = await tasks[0]
    assert t.outcome + rest == "echo: slow stream 0.3 a b c"
    assert call.model_dump() == as_recorded


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_is_recorded_as_sent_when_another_task_changes_its_messages_while_it_waits(kw, server, stream):
    """A task of the agent's edits the message list in place and appends to it while an
    ``acompletion`` waits for its answer: the call is recorded with what it sent."""
    async def create(messages):
        r = await litellm.acompletion(messages=messages, stream=stream, **kw)
        if stream:
            async for _ in r:
                pass

    def change(messages):
        messages[0]["content"] = "edited while the call waited"
        messages.append({"role": "user", "content": "typed while the call waited"})

    t, body = await changed_while_waiting(server, create, user("warm up"), change)
    assert [m["content"] for m in body["messages"]] == ["warm up", WAITING]
    assert t.calls[1].messages == body["messages"]

async def test_messages_given_as_a_generator_reach_the_server_and_the_record_alike(kw, server):
    before = len(server.requests)
    history = user("from a generator")

    @art.rollout
    async def agent():
        litellm.completion(messages=(m for m in history), **kw)
        await litellm.acompletion(messages=iter(history), **kw)

    t = await agent.collect()
    assert t.error is None and len(t.calls) == 2
    for i, call in enumerate(t.calls):
        assert server.requests[before + i]["body"]["messages"] == history == call.messages
        assert call.message["content"] == "echo: from a generator"
