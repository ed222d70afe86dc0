"""Token-in continuation: a conversation's next prompt carries the tokens the server sampled
for its earlier answers, so an 8-call tool-using rollout trains as one segment whose trained
tokens are exactly the sampled ones -- even when the agent sends its tool calls back laid out
its own way. An agent that changed its history gets a prompt rendered from the text, as
before, and its trajectory says so."""

import json

import pytest
from openai import AsyncOpenAI

import artsdk as art
from backends.local import LocalBackend
from backends.local.batch import segments

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
ASK = [{"role": "user", "content": "find a"}]
CALL = '<tool_call>{"name": "search", "arguments": {"q": "a"}}</tool_call>'


@pytest.fixture
async def taught(tmp_path, art_store):
    """The tiny model, taught to answer with a search call whatever the conversation holds."""
    be = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "home"))
    model = art.TrainableModel("m", base_model="tiny", project="c")
    async with art.session(model, backend=be) as run:
        lesson = [{"messages": ASK + [{"role": "assistant", "content": CALL}], "tools": TOOLS}]
        convo = list(ASK)
        for k in range(3):  # and after a tool's result too
            convo += [{"role": "assistant", "content": CALL}, {"role": "user", "content": f"<tool_response>\nr{k}\n</tool_response>"}]
            lesson.append({"messages": convo + [{"role": "assistant", "content": CALL}], "tools": TOOLS})
        await run.train_sft(lesson, learning_rate=1e-2, epochs=40, batch_size=2)
        yield run, be
    await be.close()


def agent(client, compact: bool, edit_at: int = -1):
    @art.rollout
    async def researcher() -> int:
        messages = list(ASK)
        for k in range(8):
            r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0,
                                                     max_tokens=40)
            msg = r.choices[0].message
            if msg.tool_calls:
                calls = []
                for tc in msg.tool_calls:
                    args = json.loads(tc.function.arguments)
                    # the agent lays the arguments out its own way (as many frameworks do)
                    text = json.dumps(args, separators=(",", ":")) if compact else tc.function.arguments
                    calls.append({"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                                                "arguments": text}})
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
                messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": f"r{k}"})
            else:
                messages.append({"role": "assistant", "content": msg.content})
                messages.append({"role": "user", "content": f"r{k}"})
            if k == edit_at:  # the agent rewrites an earlier answer
                messages[1] = {"role": "assistant", "content": "I searched."}
        return len(messages)

    return researcher


async def test_an_8_call_tool_using_rollout_trains_as_one_segment(taught):
    run, be = taught
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    (group,) = await art.gather(agent(client, compact=True), [art.Args()], group_size=1)
    (t,) = group.trajectories
    assert t.error is None and len(t.calls) == 8
    assert sum(1 for c in t.calls if c.message.get("tool_calls")) >= 4  # it does call the tool
    served = be.models["m"]
    tk = served.tokenizing()
    segs = segments(t, 1.0, tk).segments
    assert len(segs) == 1  # eight calls, one sequence (it split wherever the text was re-rendered)
    trained = [tok for tok, on in zip(segs[0].tokens, segs[0].trained) if on]
    assert trained == [tok for c in t.calls for tok in c.choices[0].token_ids]  # exactly the sampled tokens
    for a, b in zip(t.calls, t.calls[1:]):  # each prompt carries the one before and what it sampled
        assert b.prompt_token_ids[:len(a.prompt_token_ids) + len(a.choices[0].token_ids)] == \
            a.prompt_token_ids + a.choices[0].token_ids
    assert not [w for w in t.warnings if "history" in w]
    await client.close()


async def test_a_changed_history_is_rendered_from_text_and_said(taught):
    run, be = taught
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    (group,) = await art.gather(agent(client, compact=False, edit_at=3), [art.Args()], group_size=1)
    (t,) = group.trajectories
    assert t.error is None and len(t.calls) == 8
    segs = segments(t, 1.0, be.models["m"].tokenizing()).segments
    assert len(segs) == 2  # before the edit, and after it
    (warning,) = [w for w in t.warnings if "history" in w]
    assert "call 4" in warning
    await client.close()
