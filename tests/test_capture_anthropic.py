"""Capture of the ``anthropic`` client's Messages API against a real HTTP server on 127.0.0.1
(artsdk's mock server): ``messages.create`` plain and ``stream=True``, ``messages.stream()``,
sync and async, the raw-response wrapper -- each call recorded once, in the order made, with
its blocks, its chat view and its token ids, the agent getting what the plain client gives; in
a session the calls go to the backend whatever base URL the client was built with; a stored
trajectory replays; a call that escapes capture is reported by name. No torch: this runs in
the oldest row of the compatibility matrix too (test_local_messages.py trains through it)."""

import inspect

import pytest

import artsdk as art
from artsdk.capture.record import CUT
from tests.while_waiting import WAITING, changed_while_waiting

anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.anyio
TOOLS = [{"name": "search", "description": "Search.", "input_schema": {"type": "object",
                                                                        "properties": {"q": {"type": "string"}}}}]


@pytest.fixture
def sync_anthropic(server):
    client = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="k", max_retries=0)
    yield client
    client.close()


@pytest.fixture
async def async_anthropic(server):
    client = anthropic.AsyncAnthropic(base_url=server.base_url.removesuffix("/v1"), api_key="k", max_retries=0)
    yield client
    await client.close()  # with the test's event loop


def test_create_records_blocks_chat_view_and_tokens(sync_anthropic, server):
    sync = sync_anthropic

    @art.rollout
    def agent(q):
        m = sync.messages.create(model="m", max_tokens=50, system="Be brief.", stop_sequences=["zzz"],
                                 messages=[{"role": "user", "content": [{"type": "text", "text": q}]}],
                                 extra_body={"temperature": 0.5})  # where anthropic 2.x takes it
        return m.content[0].text

    server.set_step(2)
    try:
        t = agent.collect_sync("hello")
    finally:
        server.set_step(0)
    assert t.error is None and t.outcome == "echo: hello", t.error
    (call,) = t.calls
    assert call.provider == "anthropic" and call.served_by == "m@2" and call.step == 2 and not call.stream
    assert call.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert call.params["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert call.params["system"] == "Be brief." and call.params["stop_sequences"] == ["zzz"]
    assert call.params["max_tokens"] == 50 and call.params["temperature"] == 0.5  # what training scores at
    ch = call.choices[0]
    assert ch.message["content"] == "echo: hello" and ch.message["blocks"] == [{"type": "text", "text": "echo: hello"}]
    assert ch.message["stop_reason"] == "end_turn" and ch.finish_reason == "stop"
    assert ch.token_ids == [ord(c) for c in "echo: hello"] and ch.logprobs == [-0.5] * 11 and ch.trainable
    assert call.prompt_token_ids and call.usage == {"prompt_tokens": 3, "completion_tokens": 11, "total_tokens": 14}


async def test_a_tool_loop_streamed_both_ways(async_anthropic):
    client = async_anthropic

    @art.rollout
    async def agent(q):
        messages = [{"role": "user", "content": f"tool please {q}"}]
        stream = await client.messages.create(model="m", max_tokens=50, tools=TOOLS, messages=messages, stream=True)
        kinds = [e.type async for e in stream]
        async with client.messages.stream(model="m", max_tokens=50, tools=TOOLS, messages=messages) as s:
            first = await s.get_final_message()
        use = first.content[0]
        messages += [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
        final = await client.messages.create(model="m", max_tokens=50, tools=TOOLS, messages=messages)
        return kinds, final.content[0].text

    t = await agent.collect("x")
    kinds, text = t.outcome
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and text == "done: 42"
    streamed, helper, last = t.calls
    assert [c.stream for c in t.calls] == [True, True, False]
    for call in (streamed, helper):  # the stream assembled: the tool_use block whole, its input parsed
        (block,) = call.choices[0].message["blocks"]
        assert block["type"] == "tool_use" and block["name"] == "search" and block["input"] == {"q": "tool please x"}
        assert call.choices[0].finish_reason == "tool_calls" and not call.incomplete and call.error is None
        assert call.choices[0].token_ids and call.choices[0].logprobs and call.prompt_token_ids
        assert call.usage["completion_tokens"] == len(call.choices[0].token_ids)
    assert helper.choices[0].message["tool_calls"][0]["function"]["name"] == "search"
    assert last.messages[-2]["tool_calls"][0]["id"] == helper.choices[0].message["blocks"][0]["id"]
    assert last.messages[-1] == {"role": "tool", "tool_call_id": helper.choices[0].message["blocks"][0]["id"],
                                 "content": "42"}
    assert last.tools == [{"type": "function", "function": {"name": "search", "description": "Search.",
                                                            "parameters": TOOLS[0]["input_schema"]}}]


def test_the_sync_client_records_in_the_order_calls_are_made(sync_anthropic):
    sync = sync_anthropic

    @art.rollout
    def agent(q):
        ask = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": q}]}
        a = sync.messages.create(**ask)
        b = "".join(e.delta.text for e in sync.messages.create(**ask, stream=True) if e.type == "content_block_delta")
        with sync.messages.stream(**ask) as s:
            c = "".join(s.text_stream)
        manager = sync.messages.stream(**{**ask, "max_tokens": 5})  # made first, sent when entered: last
        d = sync.messages.create(**{**ask, "max_tokens": 6})
        with manager as s:
            e = s.get_final_text()
        return [a.content[0].text, b, c, d.content[0].text, e]

    t = agent.collect_sync("hi")
    assert t.error is None and t.outcome == ["echo: hi"] * 5
    assert [c.params["max_tokens"] for c in t.calls] == [4, 4, 4, 6, 5]
    assert [c.stream for c in t.calls] == [False, True, True, False, True]
    assert all(c.choices[0].message["content"] == "echo: hi" and c.choices[0].token_ids for c in t.calls)


async def test_a_cut_stream_is_recorded_incomplete(async_anthropic):
    client = async_anthropic

    @art.rollout
    async def agent(q):
        stream = await client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": q}],
                                              stream=True)
        return [e.type async for e in stream]

    t = await agent.collect("cut stream now")
    (call,) = t.calls
    assert call.incomplete and call.error == CUT and not call.choices[0].token_ids


async def test_the_raw_response_wrapper_is_recorded(async_anthropic):
    client = async_anthropic

    @art.rollout
    async def agent(q):
        raw = await client.messages.with_raw_response.create(model="m", max_tokens=9,
                                                             messages=[{"role": "user", "content": q}])
        parsed = raw.parse()  # a coroutine on anthropic 2.x, the Message before
        return (await parsed if inspect.isawaitable(parsed) else parsed).content[0].text

    t = await agent.collect("raw")
    assert t.error is None, t.error
    (call,) = t.calls
    assert t.outcome == "echo: raw" == call.choices[0].message["content"]
    assert call.choices[0].token_ids == [ord(c) for c in "echo: raw"]


async def test_a_session_routes_the_calls_and_a_stored_trajectory_replays(art_store):
    from artsdk.testing.mock_server import MockServer
    from tests.test_session_config import ScriptedBackend

    client = anthropic.AsyncAnthropic(api_key="user-key", max_retries=0)  # Anthropic's own API, by default

    @art.rollout
    async def agent(q: str):
        m = await client.messages.create(model="ttt", max_tokens=9, messages=[{"role": "user", "content": q}])
        async with client.messages.stream(model="ttt", max_tokens=9,
                                          messages=[{"role": "user", "content": q + "!"}]) as s:
            text = await s.get_final_text()
        return m.content[0].text + " | " + text

    with MockServer() as backend_server:
        async with art.session(art.TrainableModel("ttt", base_model="tiny"), backend=ScriptedBackend(backend_server)):
            t = await agent.collect("hi")
        assert [r["api"] for r in backend_server.requests] == ["messages", "messages"]
        # the backend's key, not the user's (as x-api-key or a bearer token: the client's choice)
        assert {r["auth"].removeprefix("Bearer ") for r in backend_server.requests} == {"backend-key"}
    assert t.outcome == "echo: hi | echo: hi!" and {c.served_by for c in t.calls} == {"ttt@0"}
    stored = art_store.get(t.id)
    assert stored.calls[1].choices[0].message["blocks"] == t.calls[1].choices[0].message["blocks"]
    again = await art.replay.rerun(agent, stored)  # no request reaches any server
    assert again.error is None and again.outcome == t.outcome
    await client.close()


async def test_a_messages_call_that_escapes_capture_is_reported_by_name(async_anthropic, server):
    import httpx

    client = async_anthropic

    @art.rollout
    async def sneaky(i: int) -> int:
        r = await client.post("/v1/messages", body={"model": "m", "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": "hi"}]},
                              cast_to=httpx.Response)
        return r.status_code

    t = await sneaky.collect(0)
    assert t.calls == []
    (note,) = [w for w in t.warnings if w.startswith("an LLM call escaped capture")]
    assert f"POST {server.base_url}/messages was sent with the anthropic client" in note
    assert "client.messages.create" in note
    art.configure(strict_capture=True)
    try:
        t = await sneaky.collect(0)
    finally:
        art.configure(strict_capture=None)
    # the agent gets the refusal itself, not the client's APIConnectionError after its retries
    assert t.error.type == "CaptureError" and "anthropic client" in t.error.message
    assert "the agent got" not in t.error.message and "APIConnectionError" not in t.error.traceback


def test_a_growing_conversation_reuses_its_copies_and_keeps_each_calls_messages_as_sent(sync_anthropic):
    """The agent appends the response's own content blocks and resends: each call reuses the
    copies and chat view the call before made of the messages they share, yet records what it
    sent -- an edit deep inside a message is seen by the next call and by no earlier one."""
    sync = sync_anthropic

    @art.rollout
    def agent():
        messages = [{"role": "user", "content": [{"type": "text", "text": "first"}]}]
        for k in range(2):
            answer = sync.messages.create(model="m", max_tokens=20, system="Be brief.", messages=messages)
            messages += [{"role": "assistant", "content": answer.content},  # the response's block objects
                         {"role": "user", "content": f"more {k}"}]
        sync.messages.create(model="m", max_tokens=20, system="Be brief.", messages=messages)
        messages[0]["content"][0]["text"] = "[cut]"  # an edit deep inside the first message
        sync.messages.create(model="m", max_tokens=20, system="Be brief.", messages=messages)

    t = agent.collect_sync()
    assert t.error is None, t.error
    first, second, third, fourth = t.calls
    assert [m["content"] for m in third.messages] == ["Be brief.", "first", "echo: first", "more 0",
                                                      "echo: more 0", "more 1"]
    for later, earlier in ((second, first), (third, second)):  # reused, not copied again
        assert all(a is b for a, b in zip(later.params["messages"], earlier.params["messages"]))
        assert all(a is b for a, b in zip(later.messages, earlier.messages))
    assert fourth.params["messages"][0]["content"][0]["text"] == "[cut]" and fourth.messages[1]["content"] == "[cut]"
    assert fourth.params["messages"][1:] == third.params["messages"][1:]
    for call in (first, second, third):
        assert call.params["messages"][0]["content"][0]["text"] == "first" and call.messages[1]["content"] == "first"


@pytest.mark.parametrize("how", ["create", "create streamed", "stream helper"])
async def test_a_call_is_recorded_as_sent_when_another_task_changes_its_messages_while_it_waits(async_anthropic,
                                                                                                server, how):
    """A task of the agent's edits the message list in place and appends to it while a call
    waits for its answer: the call is recorded with what it sent (the server's record)."""
    client = async_anthropic

    async def create(messages):
        if how == "stream helper":
            async with client.messages.stream(model="m", max_tokens=20, messages=messages) as s:
                await s.get_final_message()
        elif how == "create streamed":
            async for _ in await client.messages.create(model="m", max_tokens=20, messages=messages, stream=True):
                pass
        else:
            await client.messages.create(model="m", max_tokens=20, messages=messages)

    def change(messages):
        messages[0]["content"][0]["text"] = "edited while the call waited"
        messages.append({"role": "user", "content": "typed while the call waited"})

    t, body = await changed_while_waiting(server, create, [{"role": "user", "content": [{"type": "text",
                                                                                        "text": "warm up"}]}], change)
    sent = body["messages"]
    assert sent[0]["content"][0]["text"] == "warm up" and len(sent) == 2
    call = t.calls[1]
    assert call.params["messages"] == [{"role": "user", "content": [{"type": "text", "text": "warm up"}]},
                                       {"role": "user", "content": [{"type": "text", "text": WAITING}]}]
    assert [m["content"] for m in call.messages] == ["warm up", WAITING]


def test_a_calls_params_are_recorded_as_sent_when_the_agent_reuses_and_changes_them(sync_anthropic, server):
    """Stop sequences and metadata the agent keeps and changes between calls: each call's
    params say what that call sent."""
    before = len(server.requests)

    @art.rollout
    def agent():
        stops, metadata = ["\n\nHuman:"], {"user_id": "a"}
        for _ in range(2):
            sync_anthropic.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}],
                                           stop_sequences=stops, metadata=metadata)
            stops.append("END")
            metadata["user_id"] = "b"

    t = agent.collect_sync()
    assert t.error is None
    first, second = t.calls
    sent = server.requests[before]["body"]
    assert first.params["stop_sequences"] == sent["stop_sequences"] == ["\n\nHuman:"]
    assert first.params["metadata"] == sent["metadata"] == {"user_id": "a"}
    assert second.params["stop_sequences"] == ["\n\nHuman:", "END"] and second.params["metadata"] == {"user_id": "b"}


def test_messages_given_as_a_generator_reach_the_server_and_the_record_alike(sync_anthropic, server):
    before = len(server.requests)
    history = [{"role": "user", "content": "from a generator"}]

    @art.rollout
    def agent():
        sync_anthropic.messages.create(model="m", max_tokens=20, messages=(m for m in history))

    t = agent.collect_sync()
    assert t.error is None
    (call,) = t.calls
    assert server.requests[before]["body"]["messages"] == history
    assert call.messages == history and call.message["content"] == "echo: from a generator"
