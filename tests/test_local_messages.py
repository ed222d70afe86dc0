"""The local backend's Anthropic Messages API (``/v1/messages``), with the tiny model, over real
HTTP and the real ``anthropic`` client: token-exact answers, Anthropic's stream of events,
tool_use / tool_result blocks through the chat template, errors in Anthropic's shape, the
key by ``x-api-key``; and an agent written against the ``anthropic`` client, unchanged, trained
through a session: recorded token-exactly, each step's calls served by the newest adapter."""

import json

import httpx
import pytest

import artsdk as art
from tests.learning import learn_to_say

anthropic = pytest.importorskip("anthropic")
torch = pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402
from backends.local.batch import Tokenizing, segments  # noqa: E402

pytestmark = pytest.mark.anyio
TOOLS = [{"name": "search", "description": "Search the web.",
          "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
LOOKUP = [{"name": "lookup", "description": "Look a word up.",
           "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}]
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "x"}'}}


@pytest.fixture
async def served(tmp_path):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"), api_key="secret")
    endpoint = await be.register(art.TrainableModel("r", base_model="tiny"))
    root = endpoint.base_url.removesuffix("/v1")
    client = anthropic.AsyncAnthropic(base_url=root, api_key="secret", max_retries=0)  # sends x-api-key
    yield be.models["r"], client, root
    await client.close()
    await be.close()


async def test_answers_are_token_exact_and_streams_match(served):
    model, client, _ = served
    ask = {"model": "r", "max_tokens": 10, "system": "Be brief.", "messages": [{"role": "user", "content": "hello"}],
           "extra_body": {"seed": 7}}
    m = await client.messages.create(**ask)
    assert m.model == "r@0" and m.type == "message" and m.role == "assistant"
    ids = m.model_extra["token_ids"]
    assert 1 <= len(ids) <= 10 and len(m.model_extra["logprobs"]) == len(ids)
    text = model.tokenizer.decode([t for t in ids if t not in model.chat.stop_ids])
    assert [b.type for b in m.content] == (["text"] if text else []) and (m.content[0].text if text else "") == text
    assert m.stop_reason == ("max_tokens" if len(ids) == 10 and ids[-1] not in model.chat.stop_ids else "end_turn")
    prompt = model.chat.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}])
    assert m.model_extra["prompt_token_ids"] == prompt
    assert (m.usage.input_tokens, m.usage.output_tokens) == (len(prompt), len(ids))
    counted = await client.messages.count_tokens(model="r", system="Be brief.",
                                                 messages=[{"role": "user", "content": "hello"}])
    assert counted.input_tokens == len(prompt)  # the prompt the model would read, as the template renders it
    # the same seed, streamed: the same tokens, as Anthropic's events in Anthropic's order
    stream = await client.messages.create(**ask, stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert events[0].message.model_extra["prompt_token_ids"] == prompt
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text
    assert events[-2].model_extra["token_ids"] == ids and events[-2].delta.stop_reason == m.stop_reason
    # the client's own helper reads the stream to its final message
    async with client.messages.stream(**ask) as s:
        final = await s.get_final_message()
    assert final.content[0].text == text and final.stop_reason == m.stop_reason


async def test_stop_sequences_are_named_when_met(served):
    model, client, _ = served
    m = await client.messages.create(model="r", max_tokens=12, messages=[{"role": "user", "content": "hi"}],
                                     extra_body={"seed": 3})
    text = m.content[0].text
    stop = text[3:6]  # a piece of what the seed samples: met the second time
    again = await client.messages.create(model="r", max_tokens=12, messages=[{"role": "user", "content": "hi"}],
                                         stop_sequences=[stop], extra_body={"seed": 3})
    assert again.stop_reason == "stop_sequence" and again.stop_sequence == stop
    assert again.content[0].text == text[:text.index(stop)]


async def test_tool_use_comes_back_as_blocks_and_results_go_into_the_prompt(served, monkeypatch):
    model, client, _ = served
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    # the untrained tiny model does not write tool calls: its answer is read as one here (a
    # model taught to call the tool answers with a real one in test_tool_calls)
    monkeypatch.setattr(model.chat, "parse", lambda text, tools: ("Let me look.", [call]) if tools else (text, None))
    m = await client.messages.create(model="r", max_tokens=4, tools=TOOLS,
                                     messages=[{"role": "user", "content": "find x"}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["text", "tool_use"]
    use = m.content[1]
    assert (use.id, use.name, use.input) == ("call_1", "search", {"q": "x"})
    turn = [{"role": "user", "content": "find x"}, {"role": "assistant", "content": m.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "x is 42"},
                                         {"type": "text", "text": "and?"}]}]
    again = await client.messages.create(model="r", max_tokens=4, tools=TOOLS, messages=turn)
    prompt = again.model_extra["prompt_token_ids"]
    text = model.tokenizer.decode(prompt)
    assert "<tool_response>\nx is 42" in text and text.index("x is 42") < text.index("and?")
    # the earlier answer went into the prompt as the tokens sampled for it (token-in continuation)
    assert prompt[:len(m.model_extra["prompt_token_ids"])] == m.model_extra["prompt_token_ids"]
    start = len(m.model_extra["prompt_token_ids"])
    assert prompt[start:start + len(m.model_extra["token_ids"])] == m.model_extra["token_ids"]
    # streamed with tools: the blocks at the end, the call's input as one JSON delta
    async with client.messages.stream(model="r", max_tokens=4, tools=TOOLS,
                                      messages=[{"role": "user", "content": "find x"}]) as s:
        final = await s.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"q": "x"}
    assert final.stop_reason == "tool_use"
    hidden = await client.messages.create(model="r", max_tokens=4, tools=TOOLS, tool_choice={"type": "none"},
                                          messages=[{"role": "user", "content": "find x"}])
    assert hidden.stop_reason != "tool_use" and '"name": "search"' not in model.tokenizer.decode(
        hidden.model_extra["prompt_token_ids"])  # tool_choice none: no tools offered


async def test_a_tool_call_whose_input_is_no_object_is_text(served, monkeypatch):
    """What the model wrote is its answer, never an error: a call with arguments that are not a
    JSON object cannot be a tool_use block, so it comes back as the text the model wrote."""
    model, client, _ = served
    odd = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '"just text"'}}
    monkeypatch.setattr(model.chat, "parse", lambda text, tools: (None, [odd]))
    m = await client.messages.create(model="r", max_tokens=4, tools=TOOLS,
                                     messages=[{"role": "user", "content": "find x"}])
    assert m.stop_reason != "tool_use" and all(b.type == "text" for b in m.content)


async def test_errors_come_in_anthropics_shape_and_the_key_is_checked(served):
    model, client, root = served
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="r", max_tokens=4, messages=[{"role": "system", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.role" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="unknown model 'nope'; this server has: r"):
        await client.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="only custom tools"):
        await client.messages.create(model="r", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                                     tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match="top_k is not supported"):
        await client.messages.create(model="r", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                                     extra_body={"top_k": 5})
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):  # required, as Anthropic's
        await client.messages.create(model="r", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                                     extra_body={"max_tokens": None})
    wrong = anthropic.AsyncAnthropic(base_url=root, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await wrong.messages.create(model="r", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert denied.value.body["error"]["type"] == "authentication_error"
    await wrong.close()
    async with httpx.AsyncClient(base_url=root) as h:  # the same key as a bearer token also opens it
        r = await h.post("/v1/messages", headers={"Authorization": "Bearer secret"},
                         json={"model": "r", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and r.json()["type"] == "message"
        r = await h.post("/v1/chat/completions", headers={"x-api-key": "wrong"},
                         json={"model": "r", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401 and "error" in r.json() and "type" not in r.json()  # OpenAI's shape there
        r = await h.post("/v1/messages", headers={"x-api-key": "secret", "content-type": "application/json"},
                         content=json.dumps({"model": "r", "max_tokens": 2, "messages": "not a list"}))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# -- an agent on the anthropic client, trained through a session -----------------------------

def calls_the_tool(served):
    """The untrained tiny model does not write tool calls: its answers offered tools are read as
    its text and a call (a model taught to call tools writes real ones in test_tool_calls)."""
    served.chat.parse = lambda text, tools, parse=served.chat.parse: (text, [CALL]) if tools else parse(text, tools)


@art.reward
def first_token(t: art.Trajectory) -> float:
    """Differs between samples: the group has something to learn from."""
    return float(t.calls[0].choices[0].token_ids[0] % 7)


async def test_a_tool_using_agent_trains_token_exact_and_replays(tmp_path, art_store):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("claude-ish", base_model="tiny")
    # built for Anthropic's own API: in the session its calls naming the model go to the backend
    client = anthropic.AsyncAnthropic(api_key="unused", max_retries=0)

    @art.rollout
    async def agent(word: str) -> str:
        """An agent loop: answers as a Message, as a stream() helper, as raw stream events."""
        ask = {"model": "claude-ish", "system": "Use the tool.", "tools": LOOKUP, "max_tokens": 6}
        messages = [{"role": "user", "content": f"What does {word} mean?"}]
        for turn in range(3):
            if turn == 0:
                blocks = (await client.messages.create(**ask, messages=messages)).content
            elif turn == 1:
                async with client.messages.stream(**ask, messages=messages) as stream:
                    blocks = (await stream.get_final_message()).content
            else:
                events = await client.messages.create(**ask, messages=messages, stream=True)
                text = [e.delta.text async for e in events if e.type == "content_block_delta"
                        and e.delta.type == "text_delta"]
                return f"{word}: {''.join(text)}"
            uses = [b for b in blocks if b.type == "tool_use"]
            messages += [{"role": "assistant", "content": blocks},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                       "content": f"{u.input['word']} means 42"} for u in uses]}]

    async with art.session(model, backend=be) as run:
        calls_the_tool(be.models["claude-ish"])
        (group,) = await art.gather(agent, ["x"], group_size=4, rewards=[first_token])
        result = await run.train([group])
        assert result.trained and result.groups_trained == 1 and result.step == 1
        later = await agent.collect("y")
    assert {c.served_by for c in later.calls} == {"claude-ish@1"}  # the next calls: the new adapter
    t = group.trajectories[0]
    assert t.error is None and t.warnings == [] and t.outcome == "x: " + (t.calls[2].message["content"] or "")
    first, second, third = t.calls
    assert [c.provider for c in t.calls] == ["anthropic"] * 3 and [c.stream for c in t.calls] == [False, True, True]
    assert {c.served_by for c in t.calls} == {"claude-ish@0"} and all(c.choices[0].trainable for c in t.calls)
    # the blocks as sent and received, and the chat view the rest of artsdk reads
    for call in t.calls:
        assert [b["type"] for b in call.choices[0].message["blocks"]] == ["text", "tool_use"]
        assert call.choices[0].finish_reason == "tool_calls" and call.choices[0].message["stop_reason"] == "tool_use"
    assert first.choices[0].message["tool_calls"][0]["function"]["name"] == "lookup"
    assert second.params["messages"][2]["content"][0]["type"] == "tool_result"
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "x means 42"}
    assert second.tools[0]["function"]["parameters"] == LOOKUP[0]["input_schema"]
    # each prompt carries the earlier turns as the tokens sampled for them: the whole
    # conversation is one training sequence whose trained tokens are exactly those sampled
    policy = be.models["claude-ish"]
    tk = Tokenizing(policy="claude-ish", prompt_ids=policy.chat.prompt_ids, completion_ids=lambda c: [],
                    vocab_size=policy.tokenizer.vocab_size + 1000, context_length=policy.context_length)
    (seq,) = segments(t, 1.0, tk).segments
    sampled = [i for c in t.calls for i in c.choices[0].token_ids]
    assert [x for x, on in zip(seq.tokens, seq.trained) if on] == sampled
    assert seq.tokens == third.prompt_token_ids + third.choices[0].token_ids
    # stored, and replayed with no server at all: every call answered from the recording
    await be.close()
    stored = art_store.get(t.id)
    assert stored.calls[0].choices[0].message["blocks"] == first.choices[0].message["blocks"]
    again = await art.replay.rerun(agent, stored)
    assert again.error is None, again.error
    assert again.outcome == t.outcome and len(again.calls) == 3
    await client.close()


async def test_an_anthropic_agent_learns_through_the_session(tmp_path, art_store):
    """gather -> train -> hot-swap -> gather through /v1/messages, plain and streamed, token-exact:
    each step's calls are served by the newest adapter."""
    torch.manual_seed(0)
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("toy", base_model="tiny", project="learn", config={"train": {"learning_rate": 2e-2}})
    client = anthropic.AsyncAnthropic(api_key="unused", max_retries=0)
    async with art.session(model, backend=be) as run:
        @art.rollout
        async def answer(i: int) -> str:
            ask = {"model": "toy", "max_tokens": 6, "messages": [{"role": "user", "content": "Say the word."}]}
            if i % 2:
                async with client.messages.stream(**ask) as s:
                    return await s.get_final_text()
            m = await client.messages.create(**ask)
            return m.content[0].text if m.content else ""

        def token_exact(calls, step):
            assert {c.served_by for c in calls} == {f"toy@{step}"} and {c.provider for c in calls} == {"anthropic"}
            assert {c.stream for c in calls} == {False, True}
            assert all(c.choices[0].trainable and c.prompt_token_ids for c in calls)

        curve = await learn_to_say(run, answer, token_exact)
    await be.close()
    await client.close()
    assert curve[0] < 0.1 and max(curve) > 0.8, curve
