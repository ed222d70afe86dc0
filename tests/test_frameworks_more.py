"""More agent frameworks, each its idiomatic agent with a tool inside @art.rollout, 5 at once,
plain and streamed, against the scripted server on 127.0.0.1: every request the server got is
a recorded call of the rollout that made it (see test_frameworks.py). These install beside
openai 3.x; LlamaIndex, CrewAI, Instructor, Mirascope and AutoGen, which need openai 2.x, are
in test_frameworks_openai2.py."""

import pytest

import artsdk as art
from tests.test_frameworks import check, gather_counted

pytestmark = pytest.mark.anyio


def search(q: str) -> str:
    """Search the notes for q."""
    return f"result for {q}"


# -- LangGraph: the prebuilt ReAct agent over LangChain's ChatOpenAI -----------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_langgraph_react_agent(server, stream):
    pytest.importorskip("langgraph")
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
    from openai import DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient()  # its own: each test has its own event loop
    llm = ChatOpenAI(model="m", base_url=server.base_url, api_key="k", http_async_client=http, streaming=stream)
    graph = create_react_agent(llm, [search])

    @art.rollout
    async def agent(i: int):
        state = {"messages": [("user", f"tool please {i}")]}
        if stream:
            text = []
            async for message, meta in graph.astream(state, stream_mode="messages"):
                if meta.get("langgraph_node") == "agent":
                    text.append(message.content)
            return "".join(text)
        return (await graph.ainvoke(state))["messages"][-1].content

    groups, received = await gather_counted(server, agent)
    await http.aclose()
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)
    assert "done: result for tool please" in trajs[0].outcome


# -- Haystack: its Agent component over OpenAIChatGenerator ---------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_haystack_agent(server, stream):
    pytest.importorskip("haystack")
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack.tools import create_tool_from_function
    from haystack.utils import Secret

    chunks = []
    generator = OpenAIChatGenerator(model="m", api_base_url=server.base_url, api_key=Secret.from_token("k"),
                                    streaming_callback=chunks.append if stream else None)
    runner = Agent(chat_generator=generator, tools=[create_tool_from_function(search)])
    runner.warm_up()

    @art.rollout
    def agent(i: int):
        result = runner.run(messages=[ChatMessage.from_user(f"tool please {i}")])
        return result["messages"][-1].text

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls) and (bool(chunks) == stream)
    assert trajs[0].outcome.startswith("done: result for tool please")


# -- Agno: Agent over OpenAIChat ---------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_agno_agent(server, stream):
    pytest.importorskip("agno")
    from agno.agent import Agent
    from agno.models.openai import OpenAIChat

    @art.rollout
    async def agent(i: int):
        runner = Agent(model=OpenAIChat(id="m", base_url=server.base_url, api_key="k"), tools=[search],
                       telemetry=False)
        if stream:
            text = ""
            async for event in runner.arun(f"tool please {i}", stream=True):
                text = getattr(event, "content", None) or text
            return text
        return (await runner.arun(f"tool please {i}")).content

    groups, received = await gather_counted(server, agent)
    trajs = check(groups, received)
    assert all(c.stream == stream for t in trajs for c in t.calls)
