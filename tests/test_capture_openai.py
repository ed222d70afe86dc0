"""Capture of openai calls against a real HTTP server on 127.0.0.1."""

import json

import pytest
from openai import BadRequestError
from pydantic import BaseModel

import artsdk as art
from tests.while_waiting import WAITING, changed_while_waiting

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "description": "search",
                                            "parameters": {"type": "object",
                                                           "properties": {"q": {"type": "string"}}}}}]


def user(text):
    return [{"role": "user", "content": text}]


def test_sync_call_recorded_with_tokens_and_step(sync_client, server):
    @art.rollout
    def agent(q):
        r = sync_client.chat.completions.create(model="m", messages=user(q), temperature=0.7)
        return r.choices[0].message.content

    server.set_step(3)
    try:
        t = agent.collect_sync("hello")
    finally:
        server.set_step(0)
    assert t.outcome == "echo: hello"
    (call,) = t.calls
    assert call.model == "m" and call.served_by == "m@3" and call.step == 3 and t.step == 3
    assert call.messages == user("hello")
    assert call.params == {"temperature": 0.7}
    ch = call.choices[0]
    assert ch.message == {"role": "assistant", "content": "echo: hello"}
    assert ch.token_ids == [ord(c) for c in "echo: hello"]
    assert ch.logprobs == [-0.5] * len("echo: hello") and ch.trainable
    assert call.prompt_token_ids and call.latency > 0 and not call.stream


def test_token_ids_spelled_in_the_tokens_as_vllm_returns_them_are_recorded_plain_and_streamed():
    """vLLM's --return-tokens-as-token-ids sends no token_ids field: each logprob's token is
    "token:<id>". The ids are read from there, whole answers and streamed ones alike."""
    from openai import OpenAI

    from artsdk.testing.mock_server import MockServer

    with MockServer(ids_in_tokens=True) as vllm_like:
        client = OpenAI(base_url=vllm_like.base_url, api_key="k")

        @art.rollout
        def agent(q, stream):
            if not stream:
                return client.chat.completions.create(model="m", messages=user(q)).choices[0].message.content
            chunks = client.chat.completions.create(model="m", messages=user(q), stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks)

        for stream in (False, True):
            t = agent.collect_sync("vllm", stream)
            assert t.outcome == "echo: vllm"
            (ch,) = t.calls[0].choices
            assert ch.token_ids == [ord(c) for c in "echo: vllm"], stream
            assert ch.logprobs == [-0.5] * len("echo: vllm") and ch.trainable


def test_plain_call_returns_value_and_is_not_stored(sync_client, art_store):
    @art.rollout
    def agent(q):
        return sync_client.chat.completions.create(model="m", messages=user(q)).choices[0].message.content

    assert agent("x") == "echo: x"
    art_store.flush()
    assert art_store.count() == 0


async def test_async_call_and_messages_are_copied(async_client):
    @art.rollout
    async def agent(q):
        msgs = user(q)
        r = await async_client.chat.completions.create(model="m", messages=msgs)
        msgs.append(r.choices[0].message)  # the agent continues with the openai object
        msgs.append({"role": "user", "content": "again"})
        r2 = await async_client.chat.completions.create(model="m", messages=msgs)
        return r2.choices[0].message.content

    t = await agent.collect("one")
    assert t.outcome == "echo: again"
    first, second = t.calls
    assert first.messages == user("one")  # not rewritten by the later append
    assert second.messages[1] == {"role": "assistant", "content": "echo: one"}
    assert [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant"]


def test_calls_outside_a_rollout_are_not_recorded(sync_client):
    rec = art.capture.Recorder()
    r = sync_client.chat.completions.create(model="m", messages=user("free"))
    assert r.choices[0].message.content == "echo: free"
    assert rec.calls == [] and art.capture.current_recorder.get() is None


def test_sync_stream_fully_consumed(sync_client):
    @art.rollout
    def agent():
        stream = sync_client.chat.completions.create(model="m", messages=user("a b c"), stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream)

    t = agent.collect_sync()
    assert t.outcome == "echo: a b c"
    (call,) = t.calls
    assert call.stream and not call.incomplete
    assert call.message["content"] == "echo: a b c"
    assert call.choices[0].finish_reason == "stop"
    assert call.choices[0].token_ids == [ord(c) for c in "echo: a b c"]
    assert call.prompt_token_ids and len(call.prompt_token_ids) > 10  # sent on the first chunk only


def test_sync_stream_abandoned_early(sync_client):
    @art.rollout
    def agent():
        stream = sync_client.chat.completions.create(model="m", messages=user("a b c d"), stream=True)
        first = []
        for chunk in stream:
            first.append(chunk.choices[0].delta.content)
            if len(first) == 2:
                break
        return "".join(x or "" for x in first)

    t = agent.collect_sync()
    (call,) = t.calls
    assert call.incomplete and call.message["content"] == t.outcome == "echo:"


def test_sync_stream_context_manager_and_close(sync_client):
    @art.rollout
    def agent():
        with sync_client.chat.completions.create(model="m", messages=user("x y"), stream=True) as s:
            next(iter(s))
            next(iter(s))
        s2 = sync_client.chat.completions.create(model="m", messages=user("z"), stream=True)
        s2.close()
        return None

    t = agent.collect_sync()
    assert len(t.calls) == 2
    assert t.calls[0].incomplete and t.calls[0].message["content"] == "echo:"
    assert t.calls[1].incomplete and t.calls[1].choices == []  # closed before any chunk


async def test_async_stream_variants(async_client):
    @art.rollout
    async def agent():
        s = await async_client.chat.completions.create(model="m", messages=user("p q"), stream=True)
        full = "".join([c.choices[0].delta.content or "" async for c in s])
        async with await async_client.chat.completions.create(model="m", messages=user("r s t"),
                                                                stream=True) as s2:
            async for _ in s2:
                break
        return full

    t = await agent.collect()
    assert t.outcome == "echo: p q"
    assert not t.calls[0].incomplete and t.calls[0].message["content"] == "echo: p q"
    assert t.calls[1].incomplete and t.calls[1].choices[0].finish_reason is None


async def test_a_stream_of_many_batches_of_chunks_is_recorded_whole_and_once(sync_client, async_client):
    """Chunks are read into the call a batch at a time (``READ_EVERY``) as they pass, and the rest
    when the stream ends, is left or the rollout ends: every chunk of a stream several batches
    long is on the call once, in order, sync and async, read to the end or left part way."""
    from artsdk.capture.openai_patch import READ_EVERY

    words = [f"w{i}" for i in range(3 * READ_EVERY + 5)]  # a chunk a word, the role's and the stop's
    text = "echo: " + " ".join(words)
    seen = 2 * READ_EVERY + 3  # chunks the agent reads before leaving the second stream

    def pieces(contents):
        return "".join(c or "" for c in contents)

    @art.rollout
    def sync_agent():
        whole = pieces(c.choices[0].delta.content for c in sync_client.chat.completions.create(
            model="m", messages=user(" ".join(words)), stream=True))
        left = sync_client.chat.completions.create(model="m", messages=user(" ".join(words)), stream=True)
        part = pieces(c.choices[0].delta.content for _, c in zip(range(seen), left))
        left.close()
        return whole, part

    @art.rollout
    async def async_agent():
        s = await async_client.chat.completions.create(model="m", messages=user(" ".join(words)), stream=True)
        whole = pieces([c.choices[0].delta.content async for c in s])
        part = []
        s2 = await async_client.chat.completions.create(model="m", messages=user(" ".join(words)), stream=True)
        async for c in s2:
            part.append(c.choices[0].delta.content)
            if len(part) == seen:
                break  # left open: the rollout's end reads what passed
        return whole, pieces(part)

    for t in (await sync_agent.collect(), await async_agent.collect()):
        whole, part = t.outcome
        assert whole == text and len(part) < len(text)
        full, left = t.calls
        assert not full.incomplete and full.message["content"] == text
        assert full.choices[0].token_ids == [ord(c) for c in text]
        assert full.choices[0].logprobs == [-0.5] * len(text) and full.choices[0].trainable
        assert left.incomplete and left.message["content"] == part
        assert left.choices[0].token_ids == [ord(c) for c in part] and left.choices[0].trainable


async def test_a_stream_read_on_after_its_rollout_ended_leaves_the_recorded_call_as_it_was(sync_client,
                                                                                            async_client):
    """A stream the rollout left part way is recorded as it stood when the rollout ended; the
    agent reading on afterwards (a task it did not await) changes nothing on the trajectory,
    however many chunks more it reads."""
    from artsdk.capture.openai_patch import READ_EVERY

    words = " ".join(f"w{i}" for i in range(3 * READ_EVERY))
    streams = []

    @art.rollout
    def sync_agent():
        it = iter(sync_client.chat.completions.create(model="m", messages=user(words), stream=True))
        streams.append((it, [next(it) for _ in range(5)]))
        return "left"

    @art.rollout
    async def async_agent():
        s = await async_client.chat.completions.create(model="m", messages=user(words), stream=True)
        it = s.__aiter__()
        streams.append((it, [await it.__anext__() for _ in range(5)]))
        return "left"

    for t in (await sync_agent.collect(), await async_agent.collect()):
        (call,) = t.calls
        stream, _ = streams.pop(0)
        as_recorded = call.model_dump()
        assert call.incomplete and call.choices[0].token_ids == [ord(c) for c in call.message["content"]]
        if hasattr(stream, "__anext__"):
            rest = [chunk async for chunk in stream]
        else:
            rest = list(stream)
        assert len(rest) > 2 * READ_EVERY  # the agent read on, well past a batch
        assert call.model_dump() == as_recorded


async def test_abandoned_stream_still_recorded_when_rollout_ends_first(async_client):
    keep = []

    @art.rollout
    async def agent():
        s = await async_client.chat.completions.create(model="m", messages=user("never read"), stream=True)
        keep.append(s)  # neither iterated nor closed
        return "done"

    t = await agent.collect()
    assert len(t.calls) == 1 and t.calls[0].incomplete and t.calls[0].stream
    await keep[0].close()


def test_stream_helper_goes_through_create(sync_client):
    @art.rollout
    def agent():
        with sync_client.chat.completions.stream(model="m", messages=user("helper")) as s:
            for _ in s:
                pass
            return s.get_final_completion().choices[0].message.content

    t = agent.collect_sync()
    assert t.outcome == "echo: helper"
    assert len(t.calls) == 1 and t.calls[0].message["content"] == "echo: helper"


def test_tool_calls_plain_and_streamed(sync_client):
    @art.rollout
    def agent():
        r = sync_client.chat.completions.create(model="m", messages=user("tool please"), tools=TOOLS)
        s = sync_client.chat.completions.create(model="m", messages=user("tool please now"),
                                                 tools=TOOLS, stream=True)
        for _ in s:
            pass
        return r.choices[0].message.tool_calls[0].function.name

    t = agent.collect_sync()
    assert t.outcome == "search"
    plain, streamed = t.calls
    assert plain.tools == TOOLS
    assert plain.message["tool_calls"] == [{"id": "call_0", "type": "function", "function": {
        "name": "search", "arguments": json.dumps({"q": "tool please"})}}]
    assert plain.choices[0].finish_reason == "tool_calls"
    tc = streamed.message["tool_calls"][0]
    assert tc["id"] == "call_0" and tc["function"]["name"] == "search"
    assert json.loads(tc["function"]["arguments"]) == {"q": "tool please now"}
    assert streamed.choices[0].finish_reason == "tool_calls"
    expected = "search" + json.dumps({"q": "tool please now"})
    assert streamed.choices[0].token_ids == [ord(c) for c in expected]


async def test_a_stream_read_through_its_bytes_is_recorded_whole(sync_client, async_client):
    """An agent that reads a chat stream's bytes itself (``stream.response.iter_bytes()`` /
    ``iter_lines()``) instead of its chunks: recorded from the bytes (it was stored as cut
    short, with no content)."""
    @art.rollout
    async def agent():
        s = sync_client.chat.completions.create(model="m", messages=user("by bytes"), stream=True)
        raw = b"".join(s.response.iter_bytes())
        a = await async_client.chat.completions.create(model="m", messages=user("by lines"), stream=True)
        lines = [line async for line in a.response.aiter_lines()]
        return raw.count(b"data: {"), sum(line.startswith("data: {") for line in lines)

    t = await agent.collect()
    assert t.error is None and min(t.outcome) > 1
    by_bytes, by_lines = t.calls
    for call, text in ((by_bytes, "echo: by bytes"), (by_lines, "echo: by lines")):
        assert call.stream and not call.incomplete and call.error is None
        assert call.message["content"] == text and call.choices[0].trainable


async def test_n_greater_than_one(async_client):
    @art.rollout
    async def agent():
        await async_client.chat.completions.create(model="m", messages=user("many"), n=3)
        s = await async_client.chat.completions.create(model="m", messages=user("many"), n=2, stream=True)
        async for _ in s:
            pass

    t = await agent.collect()
    plain, streamed = t.calls
    assert [c.message["content"] for c in plain.choices] == ["echo#0: many", "echo#1: many", "echo#2: many"]
    assert [c.index for c in streamed.choices] == [0, 1]
    assert streamed.choices[1].message["content"] == "echo#1: many"
    assert all(c.trainable for c in plain.choices + streamed.choices)


def test_parse_and_raw_response(sync_client):
    class Answer(BaseModel):
        text: str

    @art.rollout
    def agent():
        raw = sync_client.chat.completions.with_raw_response.create(model="m", messages=user("raw"))
        assert raw.http_response.status_code == 200
        return raw.parse().choices[0].message.content

    t = agent.collect_sync()
    assert t.outcome == "echo: raw" and len(t.calls) == 1
    assert t.calls[0].message["content"] == "echo: raw"

    @art.rollout
    def parser():
        # the scripted server's echo is not JSON, so parsing the content fails after the call
        sync_client.chat.completions.parse(model="m", messages=user("parse"), response_format=Answer)

    t2 = parser.collect_sync()
    assert t2.error is not None
    sent = t2.calls[0].params["response_format"]  # the JSON schema the client sent, not "__main__.Answer"
    assert len(t2.calls) == 1 and sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Answer"
    assert "properties" in sent["json_schema"]["schema"] and json.dumps(t2.calls[0].params)


def test_failed_call_is_recorded_and_rollout_error_kept(sync_client, art_store):
    @art.rollout
    def agent():
        sync_client.chat.completions.create(model="m", messages=user("bad json"))

    t = agent.collect_sync()
    assert t.error.type == "BadRequestError" and "scripted failure" in t.error.message
    assert t.calls[0].error.startswith("BadRequestError")
    stored = art_store.get(t.id)
    assert stored.error.type == "BadRequestError" and stored.calls[0].error == t.calls[0].error
    with pytest.raises(BadRequestError):
        agent()  # a plain call still raises like the undecorated function


async def test_sync_rollout_in_gather_records_into_its_own_trajectory(sync_client):
    @art.rollout
    def agent(q):
        return sync_client.chat.completions.create(model="m", messages=user(q)).choices[0].message.content

    groups = await art.gather(agent, [f"q{i}" for i in range(6)], group_size=2, store=False)
    for i, g in enumerate(groups):
        for t in g:
            assert t.outcome == f"echo: q{i}" and t.calls[0].messages == user(f"q{i}")


def test_each_call_records_the_conversation_it_sent_even_when_the_agent_edits_it_in_place(sync_client):
    """Recording reuses the copies an earlier call made of the messages that still say the
    same (so a call costs the same at the 50th turn as at the first: bench.capture), and
    copies anew what the agent changed in place."""
    @art.rollout
    def agent():
        messages = [{"role": "user", "content": "first"}]
        for k in range(3):
            r = sync_client.chat.completions.create(model="m", messages=messages)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            messages.append({"role": "user", "content": f"more {k}"})
        messages[0]["content"] = "[cut]"  # the agent trims its history in place
        sync_client.chat.completions.create(model="m", messages=messages)

    t = agent.collect_sync()
    first, second, third, fourth = t.calls
    assert [m["content"] for m in first.messages] == ["first"]
    assert third.messages[:3] == second.messages and third.messages[0]["content"] == "first"
    assert fourth.messages[0]["content"] == "[cut]" and len(fourth.messages) == 7  # what was sent
    assert first.messages[0]["content"] == "first"  # and the earlier calls keep what they sent


@pytest.mark.parametrize("how", ["chat", "chat streamed", "responses", "responses streamed"])
async def test_a_call_is_recorded_as_sent_when_another_task_changes_its_messages_while_it_waits(async_client,
                                                                                                server, how):
    """A task of the agent's changes the message list (an edit in place, a new message) while
    a call waits for its answer: the call is recorded with what it sent -- the server's own
    record of the request -- not with the list as it stood when the answer came."""
    async def create(msgs):
        stream = how.endswith("streamed")
        if how.startswith("chat"):
            r = await async_client.chat.completions.create(model="m", messages=msgs, stream=stream)
        else:
            r = await async_client.responses.create(model="m", input=msgs, stream=stream)
        if stream:
            async for _ in r:
                pass

    def change(msgs):
        msgs[0]["content"] = "edited while the call waited"
        msgs.append({"role": "user", "content": "typed while the call waited"})

    t, body = await changed_while_waiting(server, create, [{"role": "user", "content": "warm up"}], change)
    sent = body["messages" if how.startswith("chat") else "input"]
    assert [m["content"] for m in sent] == ["warm up", WAITING]
    call = t.calls[1]
    assert call.messages == sent
    if how.startswith("responses"):
        assert call.params["input"] == sent
    assert t.calls[0].messages == [{"role": "user", "content": "warm up"}]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_messages_given_as_a_generator_reach_the_server_and_the_record_alike(sync_client, async_client,
                                                                                   server, api):
    """The clients take messages (and tools) as any iterable, a generator included, which can
    be read once: the server gets them all, and the call is recorded with them."""
    before = len(server.requests)
    history = [{"role": "user", "content": "from a generator"}]

    @art.rollout
    async def agent():
        if api == "chat":
            sync_client.chat.completions.create(model="m", messages=(m for m in history),
                                                tools=(t for t in TOOLS))
            await async_client.chat.completions.create(model="m", messages=iter(history))
        else:
            sync_client.responses.create(model="m", input=(m for m in history))
            await async_client.responses.create(model="m", input=iter(history))

    t = await agent.collect()
    assert t.error is None and len(t.calls) == 2
    for i, call in enumerate(t.calls):
        body = server.requests[before + i]["body"]
        assert body["messages" if api == "chat" else "input"] == history
        assert call.messages == history and call.choices[0].message["content"] == "echo: from a generator"
    if api == "chat":
        assert t.calls[0].tools == TOOLS == server.requests[before]["body"]["tools"]


def test_a_calls_params_are_recorded_as_sent_when_the_agent_reuses_and_changes_them(sync_client, server):
    """Sampling options the agent keeps in a list or dict and changes between calls (a stop
    list it grows, an ``extra_body`` it updates): each call's params say what that call sent."""
    before = len(server.requests)

    @art.rollout
    def agent():
        stop, extra = ["\n\n"], {"top_k": 5}
        include, text = ["message.output_text.logprobs"], {"verbosity": "low"}
        for k in range(2):
            sync_client.chat.completions.create(model="m", messages=user("hi"), stop=stop, extra_body=extra)
            sync_client.responses.create(model="m", input="hi", include=include, text=text)
            stop.append("END")
            extra["top_k"] = 50
            include.append("reasoning.encrypted_content")
            text["verbosity"] = "high"

    t = agent.collect_sync()
    assert t.error is None
    chat, responses = t.calls[0], t.calls[1]
    sent_chat, sent_responses = (server.requests[before + i]["body"] for i in (0, 1))
    assert chat.params["stop"] == sent_chat["stop"] == ["\n\n"]
    assert chat.params["extra_body"] == {"top_k": 5} and sent_chat["top_k"] == 5
    assert responses.params["include"] == sent_responses["include"] == ["message.output_text.logprobs"]
    assert responses.params["text"] == sent_responses["text"] == {"verbosity": "low"}
    assert t.calls[2].params["stop"] == ["\n\n", "END"] and t.calls[2].params["extra_body"] == {"top_k": 50}


def test_a_conversation_of_the_responses_own_messages_is_copied_once_and_its_edits_still_seen(sync_client):
    """The usual agent appends the response's ``ChatCompletionMessage`` to its history. Those
    objects never equal their dict copies, yet a later call reuses the copies (recording turn 20
    costs about what turn 1 does: bench.capture); an edit to one in place, at any depth, is
    still what that later call records, and the earlier calls keep what they sent."""
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageToolCall

    asked = ChatCompletionMessage(role="assistant", content=None, tool_calls=[ChatCompletionMessageToolCall(
        id="c1", type="function", function={"name": "look", "arguments": '{"q": 1}'})])

    @art.rollout
    def agent():
        messages = [{"role": "user", "content": "first"}]
        for k in range(3):
            r = sync_client.chat.completions.create(model="m", messages=messages)
            messages.append(r.choices[0].message)  # the response's own object
            messages.append({"role": "user", "content": f"more {k}"})
        messages += [asked, {"role": "tool", "tool_call_id": "c1", "content": "found"}]
        sync_client.chat.completions.create(model="m", messages=messages)
        messages[1].content = "[cut]"  # the agent trims its history in place
        sync_client.chat.completions.create(model="m", messages=messages)
        asked.tool_calls[0].function.arguments = '{"q": 2}'  # and edits a call deep inside a message
        sync_client.chat.completions.create(model="m", messages=messages)

    t = agent.collect_sync()
    second, third, fourth, fifth, sixth = t.calls[1:]
    assert [m["content"] for m in third.messages] == ["first", "echo: first", "more 0", "echo: more 0", "more 1"]
    for later, earlier in ((third, second), (fourth, third)):  # reused, not copied again
        assert all(a is b for a, b in zip(later.messages, earlier.messages)), later.messages
    assert fifth.messages[1]["content"] == "[cut]" and fifth.messages[0] is fourth.messages[0]
    assert fourth.messages[1]["content"] == "echo: first"  # what was sent then
    assert sixth.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"q": 2}'
    assert all(a is b for a, b in zip(sixth.messages[:-2], fifth.messages))  # the messages before it reused
    for call in (fourth, fifth):
        assert call.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"q": 1}'


def test_a_recorded_call_is_built_as_model_construct_builds_it():
    # capture builds each call with records.constructed (pydantic's model_construct, faster):
    # the same fields in the same order, the same fields set, fresh lists for what was not given
    from artsdk.trajectory.records import Choice, LLMCall, constructed

    given = {"provider": "openai", "model": "m", "messages": user("hi"), "latency": 0.5,
             "choices": [Choice(message={"role": "assistant", "content": "yo"}, token_ids=[1])]}
    ours, theirs = constructed(LLMCall, **given), LLMCall.model_construct(**given)
    assert list(ours.__dict__.items()) == list(theirs.__dict__.items())
    assert ours.model_fields_set == theirs.model_fields_set == set(given)
    assert ours.model_extra == theirs.model_extra == {} and ours == theirs
    assert ours.model_dump(exclude_unset=True) == theirs.model_dump(exclude_unset=True)
    a, b = constructed(LLMCall), constructed(LLMCall)
    a.params["k"] = 1
    assert b.params == {} and a.messages is not b.messages and a.choices is not b.choices
    extra = constructed(LLMCall, model="m", cost=3)  # a field it does not declare: kept as pydantic keeps it
    assert extra.model_extra == {"cost": 3} and extra.model == "m"


def test_threads_of_one_rollout_each_record_their_own_growing_conversation(sync_client):
    """A rollout's threads share what its calls keep of the conversation they sent (prefix.py,
    added to in place): threads growing conversations of their own at once, switched between as
    often as the interpreter can, each record exactly what they sent."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    was = sys.getswitchinterval()
    sent = {}

    def talk(who):
        messages = [{"role": "user", "content": f"{who} 0"}]
        for turn in range(1, 11):
            sync_client.chat.completions.create(model="m", messages=messages)
            sent.setdefault(who, []).append([dict(m) for m in messages])
            messages += [{"role": "assistant", "content": f"{who} said {turn}"},
                         {"role": "user", "content": f"{who} {turn}"}]

    @art.rollout
    def agent():
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(talk, range(8)))

    sys.setswitchinterval(1e-6)
    try:
        t = agent.collect_sync()
    finally:
        sys.setswitchinterval(was)
    assert t.error is None and len(t.calls) == 80
    recorded = sorted(json.dumps(c.messages) for c in t.calls)
    assert recorded == sorted(json.dumps(m) for ms in sent.values() for m in ms)


def test_an_extra_field_set_on_a_sent_object_is_what_the_next_call_records(sync_client, server):
    """The response's own message, resent, gains a field its type does not declare (a
    reasoning trace some servers add, set by the agent): the next call records it, as the
    server received it; the call before keeps what it sent."""
    before = len(server.requests)

    @art.rollout
    def agent():
        messages = [{"role": "user", "content": "hi"}]
        messages.append(sync_client.chat.completions.create(model="m", messages=messages).choices[0].message)
        messages.append({"role": "user", "content": "again"})
        sync_client.chat.completions.create(model="m", messages=messages)
        messages[1].reasoning_content = "thought it over"  # kept as an extra field by the openai type
        sync_client.chat.completions.create(model="m", messages=messages)

    _, second, third = agent.collect_sync().calls
    assert server.requests[before + 2]["body"]["messages"][1]["reasoning_content"] == "thought it over"
    assert third.messages[1]["reasoning_content"] == "thought it over"
    assert "reasoning_content" not in second.messages[1] and third.messages[0] is second.messages[0]
