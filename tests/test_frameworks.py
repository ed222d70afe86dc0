"""Agent frameworks in their default configuration, each running its idiomatic agent with a
tool inside @art.rollout, 5 rollouts at once, plain and streamed, against the scripted server
on 127.0.0.1: every request the server received is a recorded call, in order, in the
rollout that made it. Calls that escape capture are reported, never silent. openai-agents
and pydantic-ai also run through the local backend with the tiny model, token-exactly."""

import json
import os

import pytest

import artsdk as art

pytestmark = pytest.mark.anyio
ROLLOUTS = 5


async def gather_counted(server, rollout):
    """(groups, requests the server received during the gather)."""
    before = len(server.requests)
    groups = await art.gather(rollout, range(ROLLOUTS), store=False)
    return groups, server.requests[before:]


def check(groups, received, *, tool_turns=True):
    trajs = [t for g in groups for t in g]
    assert sum(len(t.calls) for t in trajs) == len(received) > 0  # recorded == received
    for t in trajs:
        i = t.scenario["i"]
        assert not any(w.startswith("an LLM call escaped") for w in t.warnings)
        for call in t.calls:  # each call is this rollout's: its own question, no other's
            text = json.dumps(call.messages)
            assert f"tool please {i}" in text and not any(f"tool please {j}\"" in text for j in range(ROLLOUTS) if j != i)
        if tool_turns:  # the tool was called, and its result went into the next call, in order
            first, second = t.calls[0], t.calls[1]
            (tc,) = first.choices[0].message["tool_calls"]
            roles = [m["role"] for m in second.messages]
            assert roles[-2:] == ["assistant", "tool"] and second.messages[-1]["tool_call_id"] == tc["id"]
            assert second.messages[-1]["content"].endswith(f"tool please {i}")
            assert second.choices[0].message["content"].startswith("done: ")
    return trajs


# -- openai-agents: the Responses API by default -------------------------------------------

@pytest.fixture
def openai_agents(server):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    agents.set_default_openai_client(client, use_for_tracing=False)

    @agents.function_tool
    def search(q: str) -> str:
        """Search the notes."""
        return f"result for {q}"

    yield agents, agents.Agent(name="helper", instructions="Help.", model="m", tools=[search])
    agents.set_default_openai_client(AsyncOpenAI(api_key="unused"), use_for_tracing=False)


async def test_openai_agents_plain_and_streamed(server, openai_agents):
    agents, agent = openai_agents

    @art.rollout
    async def plain(i: int):
        return (await agents.Runner.run(agent, f"tool please {i}")).final_output

    @art.rollout
    async def streamed(i: int):
        run = agents.Runner.run_streamed(agent, f"tool please {i}")
        async for _ in run.stream_events():
            pass
        return run.final_output

    for rollout, stream in ((plain, False), (streamed, True)):
        groups, received = await gather_counted(server, rollout)
        assert {r["api"] for r in received} == {"responses"}
        trajs = check(groups, received)
        assert all(c.provider == "openai-responses" and c.stream == stream for t in trajs for c in t.calls)
        assert trajs[0].outcome.startswith("done: result for tool please")


# -- pydantic-ai: Agent("openai:...") is the Responses API -----------------------------------

@pytest.fixture
def pydantic_agent(server, monkeypatch):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    agent = pydantic_ai.Agent("openai:m", instructions="Help.")

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the notes."""
        return f"result for {q}"

    return agent


async def test_pydantic_ai_plain_and_streamed(server, pydantic_agent):
    @art.rollout
    async def plain(i: int):
        return (await pydantic_agent.run(f"tool please {i}")).output

    @art.rollout
    async def streamed(i: int):
        async with pydantic_agent.run_stream(f"tool please {i}") as run:
            return await run.get_output()

    for rollout in (plain, streamed):
        groups, received = await gather_counted(server, rollout)
        assert {r["api"] for r in received} == {"responses"}
        check(groups, received)


# -- LangChain: chat completions, the Responses API, and streaming through raw responses ----

def langchain_agent(llm, search, stream):
    """LangChain's idiomatic tool loop over a chat model with ``search`` bound, as a rollout."""
    from langchain_core.messages import HumanMessage, ToolMessage

    @art.rollout
    async def agent(i: int):
        messages = [HumanMessage(f"tool please {i}")]
        while True:
            if stream:
                reply = None
                async for chunk in llm.astream(messages):
                    reply = chunk if reply is None else reply + chunk
            else:
                reply = await llm.ainvoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                return reply.text
            messages += [ToolMessage(search.invoke(tc["args"]), tool_call_id=tc["id"]) for tc in reply.tool_calls]

    return agent


@pytest.mark.parametrize("options,stream", [({}, False), ({}, True), ({"include_response_headers": True}, True),
                                            ({"use_responses_api": True}, False),
                                            ({"use_responses_api": True}, True)])
async def test_langchain_openai(server, options, stream):
    pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def search(q: str) -> str:
        """Search the notes."""
        return f"result for {q}"

    from openai import DefaultAsyncHttpxClient

    # its own HTTP client: LangChain otherwise shares one across event loops, and each test has its own
    http = DefaultAsyncHttpxClient()
    llm = ChatOpenAI(model="m", base_url=server.base_url, api_key="k", http_async_client=http,
                     **options).bind_tools([search])

    agent = langchain_agent(llm, search, stream)

    groups, received = await gather_counted(server, agent)
    await http.aclose()
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)


# -- LangChain's ChatAnthropic: the anthropic client's Messages API, through raw responses -----

@pytest.mark.parametrize("stream", [False, True])
async def test_langchain_anthropic(server, stream):
    pytest.importorskip("langchain_anthropic")
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    @tool
    def search(q: str) -> str:
        """Search the notes."""
        return f"result for {q}"

    from langchain_anthropic import _client_utils

    chat = ChatAnthropic(model="m", base_url=server.base_url.removesuffix("/v1"), api_key="k", max_tokens=64,
                         max_retries=0)
    llm = chat.bind_tools([search])

    agent = langchain_agent(llm, search, stream)

    groups, received = await gather_counted(server, agent)
    # LangChain keeps one HTTP client per base URL across event loops: closed with this test's
    await chat._async_client.close()
    _client_utils._get_default_async_httpx_client.cache_clear()
    assert all(t.error is None for g in groups for t in g), [t.error for g in groups for t in g]
    trajs = check(groups, received)
    assert {r["api"] for r in received} == {"messages"}
    assert all(c.provider == "anthropic" and c.stream == stream and c.choices[0].token_ids for t in trajs for c in t.calls)
    assert all(t.outcome.startswith("done: ") for t in trajs)


# -- smolagents -----------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_smolagents(server, stream):
    smolagents = pytest.importorskip("smolagents")

    @smolagents.tool
    def search(q: str) -> str:
        """Search the notes.

        Args:
            q: what to look for
        """
        return f"result for {q}"

    model = smolagents.OpenAIServerModel(model_id="m", api_base=server.base_url, api_key="k")

    @art.rollout
    def agent(i: int):
        runner = smolagents.ToolCallingAgent(tools=[search], model=model, max_steps=2, verbosity_level=0,
                                             stream_outputs=stream)
        return str(runner.run(f"tool please {i}"))  # it gives up after 2 steps: the answers are scripted

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received, tool_turns=False)
    assert all(m["role"] in ("system", "user", "assistant", "tool") and type(m["role"]) is str
               for t in trajs for c in t.calls for m in c.messages)  # its role enums stored as plain text


# -- DSPy: its own HTTP engine by default, sent through litellm inside a rollout -------------

async def test_dspy_default_engine(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    dspy = pytest.importorskip("dspy")
    lm = dspy.LM("openai/m", api_base=server.base_url, api_key="k", cache=False)
    predict = dspy.Predict("question -> answer")

    @art.rollout
    def agent(i: int):
        with dspy.context(lm=lm):
            try:
                return predict(question=f"tool please {i}").answer
            except Exception as e:  # the scripted answers are not in DSPy's format: it retries, then gives up
                return type(e).__name__

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received, tool_turns=False)
    assert {c.provider for t in trajs for c in t.calls} == {"litellm"}


# -- what escapes capture is reported ------------------------------------------------------

async def test_an_escaped_call_is_a_warning_and_strict_makes_it_an_error(server, caplog):
    import httpx

    @art.rollout
    async def sneaky(i: int):
        async with httpx.AsyncClient() as raw:  # not a client artsdk patches
            r = await raw.post(server.base_url + "/chat/completions",
                               json={"model": "m", "messages": [{"role": "user", "content": f"tool please {i}"}]})
        return r.json()["choices"][0]["message"]["content"]

    groups = await art.gather(sneaky, range(2), store=False)
    for t in (t for g in groups for t in g):
        assert t.calls == [] and t.error is None
        (note,) = [w for w in t.warnings if w.startswith("an LLM call escaped capture")]
        assert f"POST {server.base_url}/chat/completions" in note
    assert "2 of 2 rollouts made LLM calls that escaped capture" in caplog.text
    art.configure(strict_capture=True)
    try:
        groups = await art.gather(sneaky, range(1), store=False)
    finally:
        art.configure(strict_capture=None)
    (t,) = groups[0]
    assert t.error.type == "CaptureError" and "escaped capture" in t.error.message


# -- through the local backend, with the tiny model ----------------------------------------

async def test_openai_agents_and_pydantic_ai_train_token_exact_on_the_local_backend(tmp_path, monkeypatch, art_store):
    agents = pytest.importorskip("agents")
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from openai import AsyncOpenAI

    from backends.local import LocalBackend

    agents.set_tracing_disabled(True)
    agents.set_default_openai_client(AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused"),
                                     use_for_tracing=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # unused: the session routes "toy"
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    # the tiny model rarely ends an answer by itself, and openai-agents fails an answer cut at
    # max_tokens ("incomplete"): stop strings (a chat-completions field the server also takes here) end it
    stop = {"stop": ["e", "a", "o", " "]}
    oa_agent = agents.Agent(name="helper", instructions="Answer.", model="toy",
                            model_settings=agents.ModelSettings(max_tokens=32, extra_body=stop))
    pa_agent = pydantic_ai.Agent("openai:toy", instructions="Answer.",
                                 model_settings={"max_tokens": 32, "extra_body": stop})

    @art.rollout
    async def with_openai_agents(i: int):
        return (await agents.Runner.run(oa_agent, f"question {i}")).final_output

    @art.rollout
    async def with_pydantic_ai(i: int):
        return (await pa_agent.run(f"question {i}")).output

    @art.reward
    def first_token(t: art.Trajectory) -> float:
        return float(t.calls[0].choices[0].token_ids[0])

    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    async with art.session(art.TrainableModel("toy", base_model="tiny"), backend=be) as run:
        for rollout in (with_openai_agents, with_pydantic_ai):
            groups = await art.gather(rollout, range(2), group_size=3, rewards=[first_token])
            calls = [c for g in groups for t in g for c in t.calls]
            assert calls and all(c.provider == "openai-responses" and c.served_by == f"toy@{run.step}"
                                 and c.choices[0].trainable and c.prompt_token_ids for c in calls)
            result = await run.train(groups)
            assert result.trained and result.metrics["logprob_mismatch"] < 1e-3
    agents.set_default_openai_client(AsyncOpenAI(api_key="unused"), use_for_tracing=False)
    assert os.environ["OPENAI_BASE_URL"].endswith(":9/v1")
