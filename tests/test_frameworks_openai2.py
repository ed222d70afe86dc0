"""The agent frameworks whose openai plugin needs openai 2.x -- LlamaIndex, CrewAI, Instructor,
Mirascope, AutoGen -- inside @art.rollout, 5 at once, plain and streamed, against the scripted
server on 127.0.0.1: every request the server got is a recorded call of the rollout that made
it (see test_frameworks.py). They run in CI's oldest row (requirements/oldest.txt, extra
``frameworks-openai2``), where artsdk installs beside them; elsewhere they are skipped."""

import os

import pytest

import artsdk as art
from tests.test_frameworks import check, gather_counted

pytestmark = pytest.mark.anyio


def search(q: str) -> str:
    """Search the notes for q."""
    return f"result for {q}"


# -- LlamaIndex: FunctionAgent over its OpenAI LLM ---------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_llamaindex_function_agent(server, stream):
    pytest.importorskip("llama_index.llms.openai")
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(model="gpt-4o-mini", api_base=server.base_url, api_key="k")

    @art.rollout
    async def agent(i: int):
        runner = FunctionAgent(tools=[FunctionTool.from_defaults(search)], llm=llm, streaming=stream)
        handler = runner.run(f"tool please {i}")
        async for _ in handler.stream_events():
            pass
        return str(await handler)

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)
    assert "done: result for tool please" in trajs[0].outcome


# -- CrewAI: a one-task crew, its native OpenAI provider ---------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_crewai_crew(server, stream, monkeypatch):
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    crewai = pytest.importorskip("crewai")
    from crewai.tools import tool

    @tool("search")
    def search_tool(q: str) -> str:
        """Search the notes for q."""
        return search(q)

    @art.rollout
    def agent(i: int):
        llm = crewai.LLM(model="openai/m", base_url=server.base_url, api_key="k", stream=stream)
        helper = crewai.Agent(role="helper", goal="answer", backstory="a helper", llm=llm, tools=[search_tool],
                              max_iter=2, verbose=False)
        task = crewai.Task(description=f"tool please {i}", expected_output="an answer", agent=helper)
        return str(crewai.Crew(agents=[helper], tasks=[task], verbose=False).kickoff())

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received, tool_turns=False)
    assert all(c.stream == stream for t in trajs for c in t.calls)


# -- Instructor: structured output over the openai client -------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_instructor(server, stream):
    instructor = pytest.importorskip("instructor")
    from openai import AsyncOpenAI
    from pydantic import BaseModel

    class Note(BaseModel):
        text: str

    raw = AsyncOpenAI(base_url=server.base_url, api_key="k")
    client = instructor.from_openai(raw, mode=instructor.Mode.JSON)

    @art.rollout
    async def agent(i: int):
        messages = [{"role": "user", "content": f'json {{"text": "tool please {i}"}}'}]
        if stream:
            last = None
            async for partial in client.chat.completions.create_partial(model="m", response_model=Note,
                                                                        messages=messages):
                last = partial
            return last.text
        return (await client.chat.completions.create(model="m", response_model=Note, messages=messages)).text

    groups, received = await gather_counted(server, agent)
    await raw.close()
    trajs = check(groups, received, tool_turns=False)
    assert all(c.stream == stream for t in trajs for c in t.calls)
    assert trajs[0].outcome == "tool please 0"


# -- Mirascope: llm.call with a tool, resumed after the tool ran ------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_mirascope(server, stream):
    pytest.importorskip("mirascope.llm")
    from mirascope import llm

    llm.register_provider("openai:completions", scope="openai/", base_url=server.base_url, api_key="k")

    @llm.tool
    def look(q: str) -> str:
        """Search the notes for q."""
        return search(q)

    @llm.call("openai/m", tools=[look])
    def ask(i: int) -> str:
        return f"tool please {i}"

    @art.rollout
    def agent(i: int):
        response = ask.stream(i) if stream else ask(i)
        for _ in range(2):
            if stream:
                response.finish()
            if not response.tool_calls:
                break
            response = response.resume(response.execute_tools())
        if stream:
            response.finish()
        return response.text()

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)


# -- AutoGen: AssistantAgent with a tool, reflecting on its result ----------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_autogen_assistant(server, stream):
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
            "structured_output": False}

    @art.rollout
    async def agent(i: int):
        client = OpenAIChatCompletionClient(model="m", base_url=server.base_url, api_key="k", model_info=info)
        helper = AssistantAgent("helper", model_client=client, tools=[search], reflect_on_tool_use=True,
                                model_client_stream=stream)
        result = await helper.run(task=f"tool please {i}")
        await client.close()
        return result.messages[-1].content

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)
    assert trajs[0].outcome.startswith("done: result for tool please")


os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
