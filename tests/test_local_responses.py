"""The local backend's Responses API (``/v1/responses``), with the tiny model, over real HTTP:
token-exact answers, streaming events, tool calls as items, previous_response_id, and a
Responses-API agent that learns through art.session."""

import json

import pytest
import torch
from openai import AsyncOpenAI, BadRequestError

import artsdk as art
from tests.learning import learn_to_say

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.anyio
TOOLS = [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]


@pytest.fixture
async def served(tmp_path):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    endpoint = await be.register(art.TrainableModel("r", base_model="tiny"))
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    yield be.models["r"], client
    await client.close()
    await be.close()


async def test_answers_are_token_exact_and_streams_match(served):
    model, client = served
    r = await client.responses.create(model="r", input="hello", instructions="Be brief.", max_output_tokens=10,
                                      extra_body={"seed": 7})
    assert r.model == "r@0" and r.status in ("completed", "incomplete")
    ids = r.model_extra["token_ids"]
    assert 1 <= len(ids) <= 10 and len(r.model_extra["logprobs"]) == len(ids)
    text = model.tokenizer.decode([t for t in ids if t not in model.chat.stop_ids])
    assert r.output_text == text
    assert r.output[0].content[0].logprobs[0].logprob == r.model_extra["logprobs"][0]
    prompt = model.chat.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}])
    assert r.model_extra["prompt_token_ids"] == prompt and r.usage.input_tokens == len(prompt)
    # the same seed, streamed: the same tokens, delivered as events
    stream = await client.responses.create(model="r", input="hello", instructions="Be brief.", max_output_tokens=10,
                                           stream=True, extra_body={"seed": 7})
    events = [e async for e in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert events[-1].response.model_extra["token_ids"] == ids
    # the openai client's own helper reads the stream to its final response
    async with client.responses.stream(model="r", input="hello", max_output_tokens=4) as s:
        assert (await s.get_final_response()).model_extra["token_ids"]


async def test_tool_calls_come_back_as_items_and_results_go_into_the_prompt(served, monkeypatch):
    model, client = served
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    # the untrained tiny model does not write tool calls: its answer is read as one here (a
    # model taught to call the tool answers with a real one in test_tool_calls)
    monkeypatch.setattr(model.chat, "parse", lambda text, tools: (None, [call]) if tools else (text, None))
    r = await client.responses.create(model="r", input="find x", tools=TOOLS, max_output_tokens=4)
    (fc,) = r.output
    assert fc.type == "function_call" and fc.call_id == "call_1" and json.loads(fc.arguments) == {"q": "x"}
    items = [{"role": "user", "content": "find x"}, fc.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": "call_1", "output": "x is 42"}]
    r2 = await client.responses.create(model="r", input=items, tools=TOOLS, tool_choice="none", max_output_tokens=4)
    prompt_text = model.tokenizer.decode(r2.model_extra["prompt_token_ids"])
    assert "<tool_response>\nx is 42" in prompt_text and '"name": "search"' in prompt_text
    stream = await client.responses.create(model="r", input="find x", tools=TOOLS, max_output_tokens=4, stream=True)
    kinds = [e.type async for e in stream]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    with pytest.raises(BadRequestError, match="only function tools"):
        await client.responses.create(model="r", input="x", tools=[{"type": "web_search"}])


async def test_previous_response_id_continues_the_conversation(served):
    _, client = served
    first = await client.responses.create(model="r", input="one", max_output_tokens=3)
    second = await client.responses.create(model="r", input="two", previous_response_id=first.id, max_output_tokens=3)
    # the second prompt is the first conversation, its answer, then the new turn
    assert second.model_extra["prompt_token_ids"][:len(first.model_extra["prompt_token_ids"])] == \
        first.model_extra["prompt_token_ids"]
    with pytest.raises(BadRequestError, match="previous_response_id 'resp_gone' is not a response this server kept"):
        await client.responses.create(model="r", input="x", previous_response_id="resp_gone")
    unkept = await client.responses.create(model="r", input="x", store=False, max_output_tokens=2)
    with pytest.raises(BadRequestError, match="is not a response this server kept"):
        await client.responses.create(model="r", input="y", previous_response_id=unkept.id)


async def test_a_responses_agent_learns_through_the_session(tmp_path, art_store):
    """gather -> train -> hot-swap -> gather through /v1/responses, token-exact."""
    torch.manual_seed(0)
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("toy", base_model="tiny", project="learn",
                               config={"train": {"learning_rate": 2e-2}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    async with art.session(model, backend=be) as run:
        @art.rollout
        async def answer(i: int) -> str:
            r = await client.responses.create(model="toy", input="Say the word.", max_output_tokens=6)
            return r.output_text

        def token_exact(calls, step):
            assert {c.served_by for c in calls} == {f"toy@{step}"} and {c.provider for c in calls} == {"openai-responses"}
            assert all(c.choices[0].trainable and c.prompt_token_ids for c in calls)

        curve = await learn_to_say(run, answer, token_exact)
    await be.close()
    await client.close()
    assert curve[0] < 0.1 and max(curve) > 0.8, curve
