"""Tool calls end to end, on either engine: the tiny model, taught by the real trainer to
call a tool, answers a tool-using agent with parsed tool calls over chat completions
(plain and streamed) and the Responses API, and capture records each call with the
exact tokens the engine sampled."""

import json

import pytest
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory
from tests.conftest import DEVICE, ENGINES

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]
FIND = [{"role": "user", "content": "find a"}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "a"}'}}]}
STEPS = 12  # the tiny model calls the tool greedily after 4-6 steps at this learning rate (one update a step)


def lesson(model: str) -> list[art.Group]:
    """Groups in which calling the tool scored 1 and answering "no" scored 0."""
    groups = []
    for _ in range(2):
        pair = []
        for answer, reward in ((CALL, 1.0), ({"role": "assistant", "content": "no"}, 0.0)):
            t = trajectory(FIND + [answer], model=model)
            t.calls[0].tools = TOOLS
            t.reward = reward
            pair.append(t)
        groups.append(art.Group(trajectories=pair))
    return groups


def search(q: str) -> str:
    return f"{q} is 42"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_taught_tool_call_is_parsed_streamed_and_recorded(tmp_path, art_store, engine):
    be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / "home"), engine=engine)
    model = art.TrainableModel("caller", base_model="tiny", project="tools",
                               config={"train": {"learning_rate": 2e-2, "minibatches": 1}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent(q: str) -> str:
        """Chat completions, streamed, until the model stops calling tools (at most twice)."""
        messages = [{"role": "user", "content": f"find {q}"}]
        for _ in range(2):
            stream = await client.chat.completions.create(model="caller", messages=messages, tools=TOOLS,
                                                          temperature=0, max_tokens=40, stream=True)
            calls: dict[int, dict] = {}
            async for chunk in stream:
                for d in chunk.choices[0].delta.tool_calls or ():
                    c = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                    c["name"] += d.function.name or ""
                    c["arguments"] += d.function.arguments or ""
            if not calls:
                break
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()]})
            for c in calls.values():
                messages.append({"role": "tool", "tool_call_id": c["id"],
                                 "content": search(**json.loads(c["arguments"]))})
        return messages[-1]["content"] or ""

    async with art.session(model, backend=be) as run:
        for _ in range(STEPS):
            assert (await run.train(lesson("caller"))).trained
        served = be.models["caller"]

        # plain chat completions: the sampled text is read as a tool call
        r = await client.chat.completions.create(model="caller", messages=FIND, tools=TOOLS, temperature=0,
                                                 max_tokens=40)
        (choice,) = r.choices
        assert r.model == f"caller@{STEPS}" and choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (tc,) = choice.message.tool_calls
        assert tc.function.name == "search" and json.loads(tc.function.arguments) == {"q": "a"}
        ids = choice.model_extra["token_ids"]
        text = served.tokenizer.decode([t for t in ids if t not in served.chat.stop_ids])
        assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
        assert len(choice.logprobs.content) == len(ids)

        # the Responses API: the same answer as a function_call item, plain and streamed
        rtools = [{"type": "function", **TOOLS[0]["function"]}]
        resp = await client.responses.create(model="caller", input=FIND, tools=rtools, temperature=0,
                                             max_output_tokens=40)
        (fc,) = resp.output
        assert fc.type == "function_call" and fc.name == "search" and json.loads(fc.arguments) == {"q": "a"}
        assert resp.model_extra["token_ids"] == ids
        stream = await client.responses.create(model="caller", input=FIND, tools=rtools, temperature=0,
                                               max_output_tokens=40, stream=True)
        events = [e async for e in stream]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and json.loads(done[0].arguments) == {"q": "a"}
        assert events[-1].type == "response.completed"

        # an agent loop inside a rollout: streamed tool call, tool result, next call; all recorded
        (group,) = await art.gather(agent, ["a"], group_size=1)
    await be.close()
    await client.close()

    (t,) = group.trajectories
    assert t.ok and len(t.calls) == 2
    first, second = t.calls
    assert first.served_by == second.served_by == f"caller@{STEPS}"
    recorded = first.choices[0]
    assert recorded.finish_reason == "tool_calls" and recorded.token_ids == ids and recorded.trainable
    assert recorded.message["tool_calls"][0]["function"]["name"] == "search"
    # the tool's answer went back into the next prompt, and the store kept the whole exchange
    assert second.messages[-1] == {"role": "tool", "tool_call_id": recorded.message["tool_calls"][0]["id"],
                                   "content": "a is 42"}
    assert "<tool_response>\na is 42" in served.tokenizer.decode(second.prompt_token_ids)
    (stored,) = art_store.trajectories(project="tools", limit=1)
    assert stored.calls[0].choices[0].token_ids == ids and stored.calls[1].messages[-1]["content"] == "a is 42"
