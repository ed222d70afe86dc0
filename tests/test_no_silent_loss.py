"""No LLM call inside a rollout is lost silently, whatever sends it: the openai client from a
thread, an executor or ``run_in_executor`` is recorded; ``requests``, ``urllib`` and
``aiohttp`` are reported by method and URL, and refused under strict capture before anything
is sent (the refusal stays on the trajectory when the agent catches it); the openai client's
legacy completions and low-level ``post()`` are named as such. And what is recorded is plain
data: openai objects nested in dict messages are dumped, so the stored trajectory, the
in-memory one and a replay agree. All against the scripted server on 127.0.0.1."""

import asyncio
import importlib.util
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import artsdk as art
from artsdk.capture.sentinel import ESCAPED

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "hi"}]


def body():
    return json.dumps({"model": "m", "messages": USER}).encode()


# -- the openai client in threads is recorded ------------------------------------------------

async def test_calls_from_threads_and_executors_are_recorded(sync_client, async_client):
    def ask(text):
        return sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}]) \
            .choices[0].message.content

    @art.rollout
    async def agent() -> list:
        out = []
        with ThreadPoolExecutor(2) as pool:
            out += list(pool.map(ask, ["pool a", "pool b"]))
        out.append(await asyncio.get_running_loop().run_in_executor(None, ask, "executor"))
        box = []
        worker = threading.Thread(target=lambda: box.append(ask("thread")))
        worker.start()
        worker.join()
        out += box
        out.append((await async_client.chat.completions.create(model="m", messages=USER)).choices[0].message.content)
        return out

    t = await agent.collect()
    assert t.error is None and len(t.outcome) == 5
    assert sorted(c.messages[0]["content"] for c in t.calls) == ["executor", "hi", "pool a", "pool b", "thread"]
    assert not t.warnings  # all five recorded: none escaped (4 of 5 were lost without a word before)


# -- other HTTP libraries are reported, or refused under strict capture ----------------------

def send_with(library, url):
    if library == "requests":
        import requests

        return requests.post(url + "/chat/completions", data=body(), headers={"content-type": "application/json"},
                             timeout=30).status_code
    if library == "urllib":
        req = urllib.request.Request(url + "/chat/completions", data=body(), method="POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status

    import aiohttp

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/chat/completions", data=body(), headers={"content-type": "application/json"}) as r:
                return r.status

    return asyncio.run(go())


@pytest.mark.parametrize("library", ["requests", "urllib", "aiohttp"])
def test_calls_through_other_http_libraries_are_named_or_refused(server, library):
    @art.rollout
    def agent() -> int:
        return send_with(library, server.base_url)

    before = len(server.requests)
    t = agent.collect_sync()
    assert t.outcome == 200 and len(server.requests) == before + 1
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]  # none before: silently lost
    assert f"POST {server.base_url}/chat/completions" in warning and "does not patch" in warning

    art.configure(strict_capture=True)
    try:
        t = agent.collect_sync()
    finally:
        art.configure(strict_capture=None)
    assert t.error is not None and t.error.type == "CaptureError"  # refused...
    assert len(server.requests) == before + 1  # ...before anything was sent (it was sent before)
    assert any("strict_capture refused" in w for w in t.warnings)


def test_a_refusal_the_agent_catches_stays_on_the_trajectory(server):
    @art.rollout
    def agent() -> str:
        try:
            send_with("urllib", server.base_url)
        except art.CaptureError:
            return "carried on"
        return "sent"

    art.configure(strict_capture=True)
    try:
        t = agent.collect_sync()
    finally:
        art.configure(strict_capture=None)
    assert t.outcome == "carried on" and t.error is None
    assert any(w.startswith(ESCAPED) and "strict_capture refused" in w for w in t.warnings)  # no trace before


def test_the_openai_client_s_own_escapes_are_named(sync_client):
    @art.rollout
    def legacy() -> None:
        try:
            sync_client.completions.create(model="m", prompt="hi")
        except Exception:  # noqa: BLE001 - the scripted server has no legacy route: the call is what matters
            pass

    @art.rollout
    def low_level() -> None:
        import openai

        sync_client.post("/chat/completions", body={"model": "m", "messages": USER}, cast_to=openai.types.chat.ChatCompletion)

    t = legacy.collect_sync()
    assert any("legacy completions API (client.completions.create)" in w for w in t.warnings), t.warnings
    t = low_level.collect_sync()
    assert any("low-level request methods (client.post" in w for w in t.warnings), t.warnings
    assert not any("a client artsdk does not patch" in w for w in t.warnings)  # what it said before


# -- openai objects nested in dict messages ----------------------------------------------------

async def test_openai_objects_in_dict_messages_are_stored_as_data(async_client, art_store):
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]

    @art.rollout
    async def agent() -> str:
        messages = [{"role": "user", "content": "tool please"}]
        first = await async_client.chat.completions.create(model="m", messages=messages, tools=tools)
        msg = first.choices[0].message
        # the common pattern: the answer's tool calls (openai objects) put back in a dict message
        messages += [{"role": "assistant", "content": msg.content, "tool_calls": msg.tool_calls},
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "found it"}]
        second = await async_client.chat.completions.create(model="m", messages=messages, tools=tools)
        return second.choices[0].message.content

    t = await agent.collect()
    assert t.outcome == "done: found it"
    json.dumps([c.messages for c in t.calls])  # TypeError: ChatCompletionMessageToolCall is not JSON, before
    call = t.calls[1].messages[1]["tool_calls"][0]
    assert isinstance(call, dict) and call["function"]["name"] == "look"
    stored = art_store.get(t.id)
    assert [c.messages for c in stored.calls] == [c.messages for c in t.calls]  # they differed before
    if importlib.util.find_spec("torch") is not None:  # the local backend renders it for training
        from backends.local.chat import message_text

        assert "look" in message_text(t.calls[1].messages[1])  # raised before
    again = await art.replay.rerun(agent, stored)
    assert again.error is None and again.outcome == t.outcome


# -- other LLM servers' routes are named too --------------------------------------------------

@pytest.mark.parametrize("route", ["/api/chat", "/api/generate", "/completion", "/models/gemini:generateContent",
                                   "/threads/thread_1/runs", "/threads/runs"])
def test_other_llm_servers_routes_are_reported_by_url(server, route):
    import httpx

    @art.rollout
    def agent() -> int:
        return httpx.post(server.base_url.removesuffix("/v1") + route, content=body(), timeout=30).status_code

    t = agent.collect_sync()
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]  # sent unreported before
    assert f"POST {server.base_url.removesuffix('/v1')}{route}" in warning


def test_a_post_that_is_no_llm_call_is_not_reported(server):
    import httpx

    @art.rollout
    def agent() -> int:
        return httpx.post(server.base_url.removesuffix("/v1") + "/api/users", content=b"{}", timeout=30).status_code

    assert not [w for w in agent.collect_sync().warnings if w.startswith(ESCAPED)]


# -- a rollout called inside another -----------------------------------------------------------

async def test_a_sub_agent_s_calls_are_on_its_trajectory_and_the_outer_one(async_client, art_store):
    @art.rollout
    async def researcher(q: str) -> str:
        r = await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.rollout
    async def lead() -> str:
        await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}])
        found = await researcher("dig")  # called plainly: a rollout of its own, inside this one
        await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": found}])
        return found

    art.configure(record_calls=True)
    try:
        outer = await lead.collect()
    finally:
        art.configure(record_calls=None)
    assert [c.messages[0]["content"] for c in outer.calls] == ["plan", "dig", outer.outcome]  # "dig" was missing
    assert not outer.warnings
    (inner,) = art_store.trajectories(rollout=researcher.name)
    assert [c.messages[0]["content"] for c in inner.calls] == ["dig"]
