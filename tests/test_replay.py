"""Replay: rescoring stored trajectories and re-running agent code from recordings."""

import json
from dataclasses import dataclass

import pytest
from openai import AsyncOpenAI

import artsdk as art

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object",
                                                                              "properties": {}}}}]


@dataclass
class Task:
    question: str
    turns: int = 2


def make_agent(client, *, suffix=""):
    @art.rollout(name="researcher")
    async def researcher(task: Task):
        msgs = [{"role": "system", "content": "answer"}, {"role": "user", "content": "tool please"}]
        r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        tc = r.choices[0].message.tool_calls[0]
        msgs.append(r.choices[0].message)
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "found it"})
        msgs.append({"role": "user", "content": task.question + suffix})
        stream = await client.chat.completions.create(model="m", messages=msgs, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        return {"answer": text, "turns": task.turns}

    return researcher


async def test_rescore_with_new_rewards_leaves_originals(server, art_store):
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    agent = make_agent(client)

    @art.reward
    def one(t):
        return 1.0

    groups = await art.gather(agent, [Task("a"), Task("bb")], group_size=2, rewards=[one])
    stored = art_store.trajectories()

    @art.reward
    def answer_length(t):
        return float(len(t.outcome["answer"]))

    @art.reward(group=True)
    def rank(ts):
        return [float(i) for i in range(len(ts))]

    new = await art.replay.rescore(stored, rewards=[answer_length, rank])
    assert [t.reward for t in stored] == [1.0] * 4
    by_id = {t.id: t for t in new}
    for g in groups:
        members = [by_id[t.id] for t in g]
        assert sorted(t.rewards["rank"] for t in members) == [0.0, 1.0]  # ranked within its group
        for t in members:
            assert t.rewards["answer_length"] == len(t.outcome["answer"])
    regrouped = await art.replay.rescore_groups(art_store.groups(), [answer_length])
    assert {g.rewards[0] for g in regrouped} == {len("echo: a"), len("echo: bb")}
    await client.close()


async def test_rerun_answers_from_the_recording_offline(server, art_store):
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    agent = make_agent(client)
    original = await agent.collect(Task("what?", turns=5))
    loaded = art_store.get(original.id)
    served_before = len(server.requests)

    rerun = await art.replay.rerun(agent, loaded)
    assert len(server.requests) == served_before  # no call reached the server
    assert rerun.outcome == original.outcome == {"answer": "echo: what?", "turns": 5}
    assert [c.message for c in rerun.calls] == [c.message for c in original.calls]
    assert rerun.metadata["replay_of"] == original.id and rerun.error is None

    # the same client pointed at a dead address still replays: nothing goes over the network
    dead = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    again = await art.replay.rerun(make_agent(dead), loaded)
    assert again.outcome == original.outcome
    await dead.close()
    await client.close()


async def test_rerun_reports_the_diverging_call(server, art_store):
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    original = await make_agent(client).collect(Task("q"))
    changed = make_agent(client, suffix=" (rephrased)")
    with pytest.raises(art.ReplayError) as e:
        await art.replay.rerun(changed, original)
    msg = str(e.value)
    assert f"call 1 of trajectory {original.id[:8]}" in msg
    assert "messages[4].content differs" in msg and json.dumps("q (rephrased)") in msg

    @art.rollout(name="researcher")
    async def shorter(task: Task):
        msgs = [{"role": "system", "content": "answer"}, {"role": "user", "content": "tool please"}]
        await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        await client.chat.completions.create(model="m", messages=msgs[:1])

    with pytest.raises(art.ReplayError, match=r"call 1 of trajectory \w+: the request has 1 messages, the recording 5"):
        await art.replay.rerun(shorter, original)

    @art.rollout(name="researcher")
    async def longer(task: Task):
        await make_agent(client)(task)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "more"}])

    with pytest.raises(art.ReplayError, match="call 2 of the re-run has no recording: trajectory .* made only 2"):
        await art.replay.rerun(longer, original)
    await client.close()


async def test_rerun_with_explicit_arguments_and_litellm(server, art_store):
    litellm = pytest.importorskip("litellm")

    @art.rollout
    async def agent(q):
        r = await litellm.acompletion(model="openai/m", api_base=server.base_url, api_key="k",
                                      messages=[{"role": "user", "content": q}])
        s = litellm.completion(model="openai/m", api_base=server.base_url, api_key="k",
                               messages=[{"role": "user", "content": q + "!"}], stream=True)
        return r.choices[0].message.content + "|" + "".join(c.choices[0].delta.content or "" for c in s)

    original = await agent.collect("hey")
    n = len(server.requests)
    again = await art.replay.rerun(agent, original, "hey")
    assert again.outcome == original.outcome == "echo: hey|echo: hey!"
    assert len(server.requests) == n


async def test_rerun_replays_parse_with_the_parsed_object(server, art_store):
    from pydantic import BaseModel

    class Answer(BaseModel):
        text: str
        score: int

    client = AsyncOpenAI(base_url=server.base_url, api_key="k")

    @art.rollout
    async def structured(q: str) -> dict:
        r = await client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": q}], response_format=Answer)
        return r.choices[0].message.parsed.model_dump()

    original = await structured.collect('json {"text": "hi", "score": 3}')
    assert original.outcome == {"text": "hi", "score": 3}
    n = len(server.requests)
    again = await art.replay.rerun(structured, art_store.get(original.id))
    assert again.outcome == original.outcome and len(server.requests) == n
    await client.close()
