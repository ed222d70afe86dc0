"""The server a session starts answers only who holds the session's key: a fresh random key per
backend, checked on every route but /health (OpenAI's ``Authorization: Bearer`` and Anthropic's
``x-api-key``), carried by the patched clients and ``art.rollout_env()`` with no change to agent
code; /docs and /openapi.json off unless asked for; a call to an ended rollout's path refused,
and logged once for that rollout. Real servers on 127.0.0.1 with the tiny model."""

import json
import logging
import os
import subprocess
import sys

import httpx
import pytest
from openai import AsyncOpenAI

import artsdk as art
from tests.conftest import needs_vllm, on_vllm

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny-agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# (method, path, body): every route that reaches the model or says what is served
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/responses", {"model": "tiny-agent", "input": "hi", "max_output_tokens": 2}),
    ("POST", "/v1/messages", {"model": "tiny-agent", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/v1/models", None),
    ("POST", "/r/some-rollout/v1/chat/completions", CHAT),
    ("POST", "/r/some-rollout/v1/messages", {"model": "tiny-agent", "max_tokens": 2,
                                              "messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/docs", None),
    ("GET", "/openapi.json", None),
]


def send(root: str, method: str, path: str, body, headers=None) -> httpx.Response:
    return httpx.request(method, root + path, json=body, headers=headers or {}, timeout=60)


@pytest.fixture
async def opened(tmp_path):
    model = art.TrainableModel("tiny-agent", base_model="tiny", project="t")
    async with art.session(model, LocalBackend(device="cpu", home=str(tmp_path / "home"))) as run:
        yield run


async def test_a_session_server_refuses_requests_without_its_key(opened):
    key = opened.endpoint.api_key
    assert key != "artsdk" and len(key) >= 22  # 24 random bytes, url-safe: 192 bits
    root = opened.endpoint.base_url.removesuffix("/v1")
    assert send(root, "GET", "/health", None).status_code == 200  # a bare health check is open
    for method, path, body in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                        {"Authorization": "Bearer artsdk"}):  # the old constant is no key either
            r = send(root, method, path, body, headers)
            assert r.status_code == 401, (path, headers, r.status_code, r.text[:200])
            assert "API key" in r.text
    for method, path, body in ROUTES:
        r = send(root, method, path, body, {"Authorization": f"Bearer {key}"})
        if path in ("/docs", "/openapi.json"):
            assert r.status_code == 404, (path, r.status_code)  # off on a session's server
        else:
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
    # Anthropic's clients send the key as x-api-key
    r = send(root, "POST", "/v1/messages", ROUTES[2][2], {"x-api-key": key})
    assert r.status_code == 200 and r.json()["type"] == "message"
    # its 401 is in Anthropic's shape on Anthropic's route
    r = send(root, "POST", "/v1/messages", ROUTES[2][2], {"x-api-key": "wrong"})
    assert r.json()["error"]["type"] == "authentication_error"


async def test_each_backend_makes_a_key_of_its_own(tmp_path):
    one = LocalBackend(device="cpu", home=str(tmp_path))
    two = LocalBackend(device="cpu", home=str(tmp_path))
    assert one.api_key != two.api_key
    assert LocalBackend(device="cpu", home=str(tmp_path), api_key="chosen").api_key == "chosen"
    # mounted in artsdk serve's own server (http=False), the outer server checks its own key
    assert LocalBackend(device="cpu", home=str(tmp_path), http=False).api_key is None


async def test_agent_code_needs_no_change_and_a_child_process_gets_the_key(opened):
    # a client built with any key (or another base URL): the patch sends the session's key
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent() -> str:
        r = await client.chat.completions.create(**CHAT)
        env = art.rollout_env()
        script = ("import os, httpx; r = httpx.post(os.environ['OPENAI_BASE_URL'] + '/chat/completions', "
                  f"json={json.dumps(CHAT)}, headers={{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}}, "
                  "timeout=60); print(r.status_code)")
        child = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
                               text=True, timeout=120)
        return f"{r.choices[0].message.content is not None} {child.stdout.strip()}"

    traj = await agent.collect()
    assert traj.error is None, traj.error
    assert traj.outcome == "True 200"
    assert len(traj.calls) == 2  # the client's call and the child's, both on the trajectory


async def test_a_call_to_an_ended_rollouts_path_is_refused_and_logged_once(opened, caplog):
    @art.rollout
    async def agent() -> str:
        return art.rollout_url()

    traj = await agent.collect()
    url = traj.outcome  # <server>/r/<rollout id>/v1
    assert traj.id in url
    headers = {"Authorization": f"Bearer {opened.endpoint.api_key}"}
    with caplog.at_level(logging.WARNING, logger="artsdk.endpoint"):
        for _ in range(3):
            r = httpx.post(url + "/chat/completions", json=CHAT, headers=headers, timeout=60)
            assert r.status_code == 410, r.text
            assert f"rollout {traj.id} has ended" in r.json()["error"]["message"]
    said = [rec for rec in caplog.records if traj.id in rec.getMessage()]
    assert len(said) == 1, [rec.getMessage() for rec in said]
    # the server's own URL still answers
    assert httpx.post(opened.endpoint.base_url + "/chat/completions", json=CHAT, headers=headers,
                      timeout=60).status_code == 200


async def test_the_docs_are_served_when_asked_for(tmp_path):
    model = art.TrainableModel("tiny-agent", base_model="tiny", project="t")
    async with art.session(model, LocalBackend(device="cpu", home=str(tmp_path), docs=True)) as run:
        root = run.endpoint.base_url.removesuffix("/v1")
        assert send(root, "GET", "/openapi.json", None).status_code == 401  # still behind the key
        r = send(root, "GET", "/openapi.json", None, {"Authorization": f"Bearer {run.endpoint.api_key}"})
        assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]


@needs_vllm
@on_vllm
async def test_the_vllm_server_behind_the_engine_takes_only_its_key(tmp_path):
    # vLLM checks its own key only under /v1; the guard the engine names to it covers the rest
    model = art.TrainableModel("tiny-agent", base_model="tiny", project="t")
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"), engine="vllm")
    try:
        endpoint = await be.register(model)
        engine = be.models["tiny-agent"].engine
        assert engine.key != endpoint.api_key  # vLLM's key is its own: only the backend talks to it
        paths = [("POST", "/v1/chat/completions", CHAT), ("POST", "/invocations", CHAT),
                 ("POST", "/tokenize", {"model": "tiny-agent", "prompt": "hi"}), ("GET", "/v1/models", None),
                 ("GET", "/docs", None), ("GET", "/openapi.json", None)]
        for method, path, body in paths:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = send(engine.base_url, method, path, body, headers)
                assert r.status_code == 401, (path, headers, r.status_code, r.text[:200])
        assert send(engine.base_url, "GET", "/health", None).status_code == 200
        mine = {"Authorization": f"Bearer {engine.key}"}
        assert send(engine.base_url, "GET", "/v1/models", None, mine).status_code == 200
        assert send(engine.base_url, "GET", "/docs", None, mine).status_code == 404  # no interactive docs
        # and the backend's own server, in front of it, answers with the session's key
        r = send(endpoint.base_url.removesuffix("/v1"), "POST", "/v1/chat/completions", CHAT,
                 {"Authorization": f"Bearer {endpoint.api_key}"})
        assert r.status_code == 200, r.text[:300]
    finally:
        await be.close()
