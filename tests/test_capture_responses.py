"""Capture of the openai client's Responses API, and of every raw-response wrapper (chat and
Responses), against a real HTTP server on 127.0.0.1: each call recorded once, complete, with
its items and the chat view, and the agent getting exactly what the plain client gives."""

import json

import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

import artsdk as art

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "name": "search", "description": "search",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]


def test_create_records_items_chat_view_and_tokens(sync_client, server):
    @art.rollout
    def agent(q):
        r = sync_client.responses.create(model="m", input=q, instructions="Be brief.", temperature=0.5)
        return r.output_text

    server.set_step(2)
    try:
        t = agent.collect_sync("hello")
    finally:
        server.set_step(0)
    assert t.outcome == "echo: hello"
    (call,) = t.calls
    assert call.provider == "openai-responses" and call.served_by == "m@2" and call.step == 2
    assert call.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert call.params["input"] == [{"role": "user", "content": "hello"}] and call.params["temperature"] == 0.5
    ch = call.choices[0]
    assert ch.message["role"] == "assistant" and ch.message["content"] == "echo: hello"
    assert ch.message["output"][0]["type"] == "message" and ch.message["id"].startswith("resp_")
    assert ch.token_ids == [ord(c) for c in "echo: hello"] and ch.logprobs == [-0.5] * 11 and ch.trainable
    assert call.prompt_token_ids and call.usage["completion_tokens"] == 11 and not call.stream


async def test_tool_calls_and_a_multi_turn_input(async_client):
    @art.rollout
    async def agent():
        first = await async_client.responses.create(model="m", input="tool please", tools=TOOLS)
        fc = next(i for i in first.output if i.type == "function_call")
        items = [{"role": "user", "content": "tool please"}, fc.model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": fc.call_id, "output": "found it"},
                 {"role": "user", "content": "thanks"}]
        second = await async_client.responses.create(model="m", input=items, tools=TOOLS)
        return fc.name, second.output_text

    t = await agent.collect()
    assert t.outcome == ("search", "echo: thanks")
    first, second = t.calls
    assert first.tools == [{"type": "function", "function": {"name": "search", "description": "search",
                                                             "parameters": TOOLS[0]["parameters"]}}]
    (tc,) = first.choices[0].message["tool_calls"]
    assert tc["function"]["name"] == "search" and json.loads(tc["function"]["arguments"]) == {"q": "tool please"}
    assert first.choices[0].finish_reason == "tool_calls"
    # the second request's items, in the chat view: user, assistant tool call, tool result, user
    assert [m["role"] for m in second.messages] == ["user", "assistant", "tool", "user"]
    assert second.messages[1]["tool_calls"][0]["id"] == tc["id"] and second.messages[2]["content"] == "found it"
    assert second.params["input"][2] == {"type": "function_call_output", "call_id": tc["id"], "output": "found it"}


async def test_streams_events_helper_and_parse(async_client):
    class Answer(BaseModel):
        text: str

    @art.rollout
    async def agent():
        stream = await async_client.responses.create(model="m", input="stream me please", stream=True)
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        async with async_client.responses.stream(model="m", input="with the helper") as s:
            async for _ in s:
                pass
            final = await s.get_final_response()
        parsed = await async_client.responses.parse(model="m", input='json {"text": "hi"}', text_format=Answer)
        return "".join(deltas), final.output_text, parsed.output_parsed.text

    t = await agent.collect()
    assert t.outcome == ("echo: stream me please", "echo: with the helper", "hi")
    streamed, helper, parsed = t.calls
    assert streamed.stream and not streamed.incomplete and streamed.choices[0].message["content"] == "echo: stream me please"
    assert streamed.choices[0].token_ids == [ord(c) for c in "echo: stream me please"]
    assert helper.stream and helper.choices[0].message["content"] == "echo: with the helper"
    assert parsed.choices[0].message["content"] == '{"text": "hi"}'
    sent = parsed.params["text"]["format"]  # the JSON schema the client sent, not "__main__.Answer"
    assert sent["type"] == "json_schema" and sent["name"] == "Answer" and "text" in sent["schema"]["properties"]
    json.dumps(parsed.params)


def test_sync_stream_helper(sync_client):
    @art.rollout
    def sync_agent():
        with sync_client.responses.stream(model="m", input="sync helper") as s:
            return s.get_final_response().output_text

    t = sync_agent.collect_sync()
    assert t.outcome == "echo: sync helper" and t.calls[0].stream and t.calls[0].choices[0].trainable


async def test_a_cut_responses_stream_is_incomplete_and_fails_the_rollout(async_client):
    @art.rollout
    async def agent():
        stream = await async_client.responses.create(model="m", input="cut stream now", stream=True)
        return "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])

    t = await agent.collect()
    assert t.outcome == "echo: cut"
    assert t.calls[0].incomplete and "cut" in t.calls[0].error and t.error.type == "StreamCutError"


# -- raw-response wrappers, chat and Responses ----------------------------------------------

def test_sync_raw_and_streaming_wrappers(sync_client):
    @art.rollout
    def agent():
        out = []
        raw = sync_client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "a"}])
        out.append(raw.parse().choices[0].message.content)
        raw = sync_client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "b c"}], stream=True)
        out.append("".join(c.choices[0].delta.content or "" for c in raw.parse()))
        with sync_client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "d"}]) as r:
            out.append(r.parse().choices[0].message.content)
        with sync_client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "e f"}], stream=True) as r:
            out.append(sum(1 for line in r.iter_lines() if line.startswith("data: {")))
        raw = sync_client.responses.with_raw_response.create(model="m", input="g")
        out.append(raw.parse().output_text)
        with sync_client.responses.with_streaming_response.create(model="m", input="h i", stream=True) as r:
            out.append(sum(1 for line in r.iter_lines() if line.startswith("data: {")))
        return out

    t = agent.collect_sync()
    assert t.outcome[:3] == ["echo: a", "echo: b c", "echo: d"] and t.outcome[4] == "echo: g"
    assert len(t.calls) == 6  # every one recorded, once
    contents = [c.choices[0].message["content"] for c in t.calls]
    assert contents == ["echo: a", "echo: b c", "echo: d", "echo: e f", "echo: g", "echo: h i"]
    assert [c.stream for c in t.calls] == [False, True, False, True, False, True]
    assert all(c.choices[0].trainable and not c.incomplete and c.error is None for c in t.calls)


async def test_async_raw_and_streaming_wrappers(async_client):
    @art.rollout
    async def agent():
        out = []
        async with async_client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "a"}]) as r:
            out.append((await r.parse()).choices[0].message.content)  # was: 'coroutine' object has no attribute
        async with async_client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "b"}], stream=True) as r:
            out.append(len([line async for line in r.iter_lines() if line.startswith("data: {")]))
        raw = await async_client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "c"}], stream=True)
        out.append("".join([c.choices[0].delta.content or "" async for c in raw.parse()]))
        async with async_client.responses.with_streaming_response.create(model="m", input="d") as r:
            out.append((await r.parse()).output_text)
        raw = await async_client.responses.with_raw_response.create(model="m", input="e f", stream=True)
        out.append("".join([e.delta async for e in raw.parse() if e.type == "response.output_text.delta"]))
        return out

    t = await agent.collect()
    assert t.outcome[0] == "echo: a" and t.outcome[2:] == ["echo: c", "echo: d", "echo: e f"]
    assert [c.choices[0].message["content"] for c in t.calls] == ["echo: a", "echo: b", "echo: c", "echo: d", "echo: e f"]
    assert all(c.choices[0].trainable and c.error is None for c in t.calls)


async def test_a_body_left_unread_is_recorded_when_the_rollout_ends(async_client):
    @art.rollout
    async def agent():
        async with async_client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "never read"}], stream=True) as r:
            return r.status_code

    t = await agent.collect()
    assert t.outcome == 200 and len(t.calls) == 1 and t.calls[0].incomplete


# -- sessions and replay ------------------------------------------------------------------

async def test_responses_calls_are_routed_in_a_session_and_replay(server, art_store):
    from artsdk.testing.mock_server import MockServer
    from tests.test_session_config import ScriptedBackend

    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="user-key", max_retries=0)

    @art.rollout
    async def agent(q: str):
        r = await client.responses.create(model="ttt", input=q)
        s = await client.responses.create(model="ttt", input=q + "!", stream=True)
        text = "".join([e.delta async for e in s if e.type == "response.output_text.delta"])
        return r.output_text + " | " + text

    @art.reward
    def length(t):
        return float(len(t.outcome))

    with MockServer() as backend_server:
        async with art.session(art.TrainableModel("ttt", base_model="tiny"), backend=ScriptedBackend(backend_server)):
            t = await agent.collect("hi")
        assert backend_server.requests[-1]["api"] == "responses"
        assert backend_server.requests[-1]["auth"] == "Bearer backend-key"
    assert t.outcome == "echo: hi | echo: hi!" and {c.served_by for c in t.calls} == {"ttt@0"}
    stored = art_store.get(t.id)
    assert stored.calls[0].choices[0].message["output"] == t.calls[0].choices[0].message["output"]
    assert stored.calls[1].choices[0].token_ids == t.calls[1].choices[0].token_ids
    rescored = await art.replay.rescore([stored], rewards=[length])
    assert rescored[0].reward == len(t.outcome)
    again = await art.replay.rerun(agent, stored)  # no request reaches any server
    assert again.outcome == t.outcome
    await client.close()


def test_a_growing_input_reuses_its_copies_and_keeps_each_calls_items_as_sent(sync_client):
    """An agent resends its input with the response's own items added: each call reuses the
    copies and chat view the call before made of the items they share (bench.capture's turn
    rows), yet records what it sent -- an edit deep inside an item is seen by the next call,
    and no call's record changes after it was made."""
    ask = {"model": "m", "tools": TOOLS, "instructions": "Be brief."}

    @art.rollout
    def agent():
        items = [{"role": "user", "content": [{"type": "input_text", "text": "tool please"}]}]
        first = sync_client.responses.create(input=items, **ask)
        items += first.output  # the response's own items, as objects
        call_id = next(i for i in first.output if i.type == "function_call").call_id
        items.append({"type": "function_call_output", "call_id": call_id, "output": "found it"})
        sync_client.responses.create(input=items, **ask)
        items.append({"role": "user", "content": "thanks"})
        sync_client.responses.create(input=items, **ask)
        items[0]["content"][0]["text"] = "[cut]"  # an edit deep inside the first item
        sync_client.responses.create(input=items, **ask)

    t = agent.collect_sync()
    first, second, third, fourth = t.calls
    assert [m["role"] for m in third.messages] == ["system", "user", "assistant", "tool", "user"]
    sent = second.params["input"]
    assert all(a is b for a, b in zip(third.params["input"], sent)) and len(sent) == 3
    assert all(a is b for a, b in zip(third.messages, second.messages)) and len(second.messages) == 4
    assert fourth.params["input"][0]["content"][0]["text"] == "[cut]" and fourth.messages[1]["content"] == "[cut]"
    assert fourth.params["input"][1:] == third.params["input"][1:]
    for call in (first, second, third):  # what each sent, then
        assert call.params["input"][0]["content"][0]["text"] == "tool please"
        assert call.messages[1]["content"] == "tool please"


def test_a_function_call_joined_to_an_earlier_calls_answer_leaves_that_calls_view_as_it_was(sync_client):
    """The chat view joins a function call to the assistant message before it; continuing an
    earlier call's view does so in a copy, and a later call that sends the shorter input again
    sees the message as it was."""
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]}
    called = {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q": "x"}'}
    inputs = [[{"role": "user", "content": "look"}, said]]
    inputs.append([*inputs[0], called, {"type": "function_call_output", "call_id": "c1", "output": "found"}])
    inputs.append(inputs[0])

    @art.rollout
    def agent():
        for items in inputs:
            sync_client.responses.create(model="m", input=items)

    short, joined, again = agent.collect_sync().calls
    assert joined.messages[1] == {"role": "assistant", "content": "let me look", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    assert short.messages[1] == again.messages[1] == {"role": "assistant", "content": "let me look"}
    assert joined.messages[0] is short.messages[0] is again.messages[0]  # the view continued, not remade


def test_a_conversation_that_branches_off_an_earlier_turn_is_recorded_as_each_branch_sent_it(sync_client):
    """An agent that goes back to an earlier turn and carries on from there (a retry, a search
    over continuations): each call reuses what it shares with the call before, and records its
    own branch -- the items and the chat view of exactly what it sent, however the calls before
    it went on."""
    def said(text, role="user"):
        return {"role": role, "content": text}

    root = [said("start"), said("one way", "assistant")]
    first = [*root, said("go on"), said("further", "assistant"), said("and on")]
    second = [*root, said("other way")]
    sent = [root, first, second, [*second, said("yes", "assistant"), said("more")], first[:3], first]

    @art.rollout
    def agent():
        for items in sent:
            sync_client.responses.create(model="m", input=items, instructions="Be brief.")

    calls = agent.collect_sync().calls
    for call, items in zip(calls, sent):
        assert call.params["input"] == items
        assert call.messages == [{"role": "system", "content": "Be brief."}, *items]
    assert calls[3].messages[1] is calls[2].messages[1] is calls[0].messages[1]  # the shared start reused


def test_an_item_of_content_neither_text_nor_parts_is_sent_inside_a_rollout_as_outside(sync_client, server):
    """An input item whose content is neither text nor a list of parts (a server would refuse
    it; the scripted one answers): inside a rollout the call goes out and is answered as it is
    outside one -- the record's chat view takes the content as it is, it does not stop the
    call -- and the call is recorded with the item as it was sent."""
    odd = [{"role": "user", "content": 5}]
    before = len(server.requests)
    outside = sync_client.responses.create(model="m", input=odd)

    @art.rollout
    def agent():
        return sync_client.responses.create(model="m", input=odd).output_text

    t = agent.collect_sync()
    assert t.error is None and t.outcome == outside.output_text
    assert [r["body"]["input"] for r in server.requests[before:]] == [odd, odd]
    (call,) = t.calls
    assert call.params["input"] == odd and call.messages == odd
