"""Whatever the model writes is model output, never a server error: a tool call whose name is
a JSON object (what a model wrote from outside, which was a 500), arguments of any shape,
JSON that does not parse, markup left open. The tiny model is taught (a supervised warm-up)
to write such a call; the parser itself is fuzzed with random JSON inside tool-call markup."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

import artsdk as art
from tests.conftest import DEVICE

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402
from backends.local.chat import ChatFormat  # noqa: E402

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
FIND = [{"role": "user", "content": "find a"}]
ODD = '<tool_call>{"name": {"x": 1}, "arguments": {}}</tool_call>'


async def test_a_tool_call_named_by_an_object_is_answered_as_text(tmp_path, art_store):
    be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / "home"))
    model = art.TrainableModel("odd", base_model="tiny", project="odd", config={"train": {"learning_rate": 2e-2}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    async with art.session(model, backend=be) as run:
        # a supervised lesson: on "find a" with the tool offered, write ODD
        await run.train_sft([{"messages": FIND + [{"role": "assistant", "content": ODD}], "tools": TOOLS}],
                            learning_rate=1e-2, epochs=60, batch_size=1)
        kw = {"model": "odd", "messages": FIND, "tools": TOOLS, "temperature": 0, "max_tokens": 40}
        r = await client.chat.completions.create(**kw)
        (choice,) = r.choices
        assert choice.message.content == ODD  # taught: the model writes it, and gets it back as text
        assert choice.message.tool_calls is None and choice.finish_reason == "stop"

        chunks = [c async for c in await client.chat.completions.create(**kw, stream=True)]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ODD
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)

        rtools = [{"type": "function", **TOOLS[0]["function"]}]
        resp = await client.responses.create(model="odd", input=FIND, tools=rtools, temperature=0,
                                             max_output_tokens=40)
        assert [o.type for o in resp.output] == ["message"] and resp.output_text == ODD
        events = [e async for e in await client.responses.create(model="odd", input=FIND, tools=rtools,
                                                                 temperature=0, max_output_tokens=40, stream=True)]
        assert events[-1].type == "response.completed" and events[-1].response.output_text == ODD
    await be.close()
    await client.close()


# JSON of any shape, where the model puts a tool call's body, its name and its arguments
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
BODY = st.one_of(
    JSON.map(json.dumps),
    st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}), JSON | st.just("search"), JSON),
    st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}), st.just("search"), JSON),
    st.text(max_size=30),
)
ANSWER = st.lists(st.tuples(st.text(max_size=10), BODY, st.sampled_from(["</tool_call>", "", "</tool"])),
                  min_size=1, max_size=3).map(lambda parts: "".join(f"{pre}<tool_call>{b}{end}" for pre, b, end in parts))


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from backends.local.models import load

    import torch

    _, tok = load("tiny", tmp_path_factory.mktemp("cache"), "cpu", torch.float32)
    return ChatFormat(tok)


def test_any_tool_call_shape_parses_to_a_valid_call_or_text(chat):
    offered = [*TOOLS, {"type": "function", "function": {"name": {"not": "a name"}}}, "junk", {"function": 3}]

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    @given(text=ANSWER, tools=st.sampled_from([TOOLS, offered]))
    def parse(text, tools):
        content, calls = chat.parse(text, tools)
        if calls is None:
            assert content == text  # not a valid call: the model's text, unchanged
            return
        for c in calls:
            assert c["type"] == "function" and c["function"]["name"] == "search"
            assert isinstance(c["function"]["arguments"], str)
        json.dumps(calls)  # a valid chat answer

    parse()
