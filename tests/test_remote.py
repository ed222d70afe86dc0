"""`artsdk serve` as a real process on 127.0.0.1 with the tiny model, driven by the remote
backend: the full loop, auth, a killed and restarted server, a dropped connection during a
training submission, and inference while a step runs."""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory

pytest.importorskip("torch")
from backends.remote import RemoteBackend  # noqa: E402
from tests.conftest import ENGINES  # noqa: E402
from tests.serve_process import KEY, Serve, free_port  # noqa: E402

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def serve(tmp_path):
    s = Serve(tmp_path, free_port()).start()
    yield s
    s.stop()


@pytest.fixture(params=ENGINES)
def serve_either(request, tmp_path):
    """`artsdk serve` with either inference engine."""
    s = Serve(tmp_path, free_port(), args=["--option", f"engine={request.param}"]).start()
    yield s
    s.stop()


def groups_for(model, tokens=(5, 6, 7)):
    out = []
    for k in range(2):
        trajs = []
        for i, r in enumerate((1.0, 0.0)):
            t = trajectory([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}],
                           token_ids=[tokens[0] + i, tokens[1] + k, tokens[2]], logprobs=[-6.0] * 3,
                           model=model)
            t.calls[0].prompt_token_ids = [1, 2, 3, 4]
            t.reward = r
            trajs.append(t)
        out.append(art.Group(trajectories=trajs))
    return out


async def test_full_loop_through_the_server_with_config_only(serve_either, art_store, monkeypatch):
    serve = serve_either
    monkeypatch.setenv("ARTSDK_BACKEND", "remote")
    monkeypatch.setenv("ARTSDK_BACKEND_URL", serve.url)
    monkeypatch.setenv("ARTSDK_API_KEY", KEY)
    art.configure()
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def say(i: int) -> str:
        r = await client.chat.completions.create(model="rt", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5)
        return r.choices[0].message.content

    @art.reward
    def length(t):
        return float(len(t.calls[0].choices[0].token_ids))

    model = art.TrainableModel("rt", base_model="tiny", project="remote")
    async with art.session(model) as run:  # the backend comes from the environment
        assert isinstance(run.backend, RemoteBackend)
        groups = await art.gather(say, range(2), group_size=4, rewards=[length])
        assert {t.calls[0].served_by for g in groups for t in g} == {"rt@0"}
        assert all(t.calls[0].choices[0].trainable for g in groups for t in g)
        result = await run.train(groups + groups_for(model.name))
        assert result.step == 1 and run.step == 1
        after = await art.gather(say, range(1), group_size=2, rewards=[length])
        assert after[0][0].calls[0].served_by == "rt@1"  # hot-swapped on the server
        assert await run.backend.checkpoints(model) == [1]
        pulled = await run.backend.pull_checkpoint(model, 1, serve.home / "pulled")
        assert (pulled / "adapter_model.safetensors").is_file() and not (pulled / "optimizer.pt").exists()
    assert art_store.steps("remote", "rt")[0]["step"] == 1
    await client.close()


async def test_a_responses_agent_trains_through_the_server(serve, art_store):
    be = RemoteBackend(serve.url, api_key=KEY)
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def say(i: int) -> str:
        r = await client.responses.create(model="rr", input="hi", max_output_tokens=6, temperature=0.8)
        return r.output_text

    @art.reward
    def word_300(t):
        ids = t.calls[0].choices[0].token_ids
        return sum(x == 300 for x in ids) / len(ids)

    async with art.session(art.TrainableModel("rr", base_model="tiny"), backend=be) as run:
        for step in range(2):
            groups = await art.gather(say, range(4), group_size=4, rewards=[word_300])
            calls = [t.calls[0] for g in groups for t in g]
            assert {c.served_by for c in calls} == {f"rr@{step}"} and all(c.choices[0].trainable for c in calls)
            result = await run.train(groups + groups_for("rr"))  # hand-made groups: a signal every step
            assert result.trained and result.step == step + 1
    await client.close()
    await be.close()


async def test_an_anthropic_agent_trains_through_the_server(serve, art_store):
    """An agent on the anthropic client, unchanged: its calls reach `artsdk serve`'s /v1/messages
    (plain and streamed), token-exact, and the next step's are served by the new adapter."""
    anthropic = pytest.importorskip("anthropic")
    be = RemoteBackend(serve.url, api_key=KEY)
    client = anthropic.AsyncAnthropic(api_key="unused", max_retries=0)

    @art.rollout
    async def say(i: int) -> str:
        ask = {"model": "ra", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
        if i % 2:
            async with client.messages.stream(**ask) as s:
                return await s.get_final_text()
        return "".join(b.text for b in (await client.messages.create(**ask)).content)

    @art.reward
    def word_300(t):
        ids = t.calls[0].choices[0].token_ids
        return sum(x == 300 for x in ids) / len(ids)

    async with art.session(art.TrainableModel("ra", base_model="tiny"), backend=be) as run:
        for step in range(2):
            groups = await art.gather(say, range(2), group_size=4, rewards=[word_300])
            calls = [t.calls[0] for g in groups for t in g]
            assert {c.served_by for c in calls} == {f"ra@{step}"} and {c.stream for c in calls} == {False, True}
            assert all(c.provider == "anthropic" and c.choices[0].trainable for c in calls)
            result = await run.train(groups + groups_for("ra"))
            assert result.trained and result.step == step + 1
    await client.close()
    await be.close()


async def test_auth_validation_and_openapi(serve):
    r = httpx.get(serve.url + "/health")
    assert r.status_code == 200 and r.json()["api"] == "1"
    assert httpx.get(serve.url + "/v1/art/models/x").status_code == 401
    assert httpx.get(serve.url + "/v1/art/models/x", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.post(serve.url + "/v1/chat/completions", json={}).status_code == 401
    h = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(serve.url + "/openapi.json", headers=h).json()["info"]["title"] == "artsdk serve"
    r = httpx.post(serve.url + "/v1/art/models", headers=h, json={"name": "../etc", "base_model": "tiny"})
    assert r.status_code == 422 and "name" in json.dumps(r.json())
    assert httpx.get(serve.url + "/v1/art/models/..%2Fetc", headers=h).status_code in (404, 422)
    assert httpx.get(serve.url + "/v1/art/models/ghost", headers=h).status_code == 404
    httpx.post(serve.url + "/v1/art/models", headers=h, json={"name": "v", "base_model": "tiny"},
               timeout=120).raise_for_status()  # the first registration loads the torch stack
    bad = {"request_id": "abcdefgh12", "groups": [{"trajectories": [{"calls": [{"choices": "oops"}]}]}]}
    r = httpx.post(serve.url + "/v1/art/models/v/train", headers=h, json=bad)
    assert r.status_code == 422 and "choices" in json.dumps(r.json()["detail"][0]["loc"])
    assert httpx.get(serve.url + "/v1/art/models/v/checkpoints/-1", headers=h).status_code == 422
    big = b"x" * (257 * 1024 * 1024)
    r = httpx.post(serve.url + "/v1/art/models/v/train", headers={**h, "content-type": "application/json"},
                   content=big)
    assert r.status_code == 413
    wrong = RemoteBackend(serve.url, api_key="bad")
    with pytest.raises(art.BackendError, match="refused the API key"):
        await wrong.register(art.TrainableModel("w", base_model="tiny"))
    await wrong.close()


async def test_retried_submission_trains_once_and_restart_resumes(serve, tmp_path):
    be = RemoteBackend(serve.url, api_key=KEY)
    model = art.TrainableModel("once", base_model="tiny", project="p")
    await be.register(model)
    body = json.dumps({"request_id": "same-request-1", "config": {},
                       "groups": [json.loads(g.model_dump_json()) for g in groups_for(model.name)]})
    h = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    # the client drops the connection right after sending, before any answer; the step runs anyway
    raw = (f"POST /v1/art/models/once/train HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body.encode()
    with socket.create_connection(("127.0.0.1", serve.port)) as sock:
        sock.sendall(raw)
    for _ in range(100):
        if await be.step(model) == 1:
            break
        await asyncio.sleep(0.1)
    r = httpx.post(serve.url + "/v1/art/models/once/train", headers=h, content=body, timeout=60)
    done = [json.loads(x) for x in r.text.splitlines() if x][-1]
    assert done["event"] == "done" and done["replayed"] and done["step"] == 1
    assert await be.step(model) == 1  # trained once, not twice
    await be.train(model, groups_for(model.name))
    assert await be.step(model) == 2

    serve.stop(signal.SIGKILL)  # killed, then restarted: models and checkpoints come back
    serve.start()
    assert await be.step(model) == 2
    assert (await be.train(model, groups_for(model.name))).step == 3
    await be.close()


async def test_server_gone_mid_step_gives_a_clear_error(serve):
    be = RemoteBackend(serve.url, api_key=KEY, retries=1, backoff=0.1)
    model = art.TrainableModel("gone", base_model="tiny")
    await be.register(model)
    serve.stop(signal.SIGKILL)
    with pytest.raises(art.BackendError, match="went away during training step .* local store"):
        await be.train(model, groups_for(model.name))
    with pytest.raises(art.BackendError, match="cannot reach artsdk serve"):
        await be.step(model)
    await be.close()


async def test_inference_keeps_flowing_during_training(serve):
    be = RemoteBackend(serve.url, api_key=KEY)
    model = art.TrainableModel("busy", base_model="tiny")
    await be.register(model)
    client = AsyncOpenAI(base_url=serve.url + "/v1", api_key=KEY, max_retries=0)
    big = [g for _ in range(40) for g in groups_for(model.name)]  # a step that takes a while

    async def ask():
        r = await client.chat.completions.create(model="busy", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=3)
        return r.model

    train = asyncio.create_task(be.train(model, big))
    answers = await asyncio.gather(*(ask() for _ in range(4)))
    result = await train
    assert result.step == 1 and set(answers) <= {"busy@0", "busy@1"} and len(answers) == 4
    # two submissions at once are serialized: steps 2 and 3, never interleaved
    r2, r3 = await asyncio.gather(be.train(model, groups_for(model.name)), be.train(model, groups_for(model.name)))
    assert sorted([r2.step, r3.step]) == [2, 3]
    await client.close()
    await be.close()


@pytest.mark.parametrize("where", ["local", "remote"])
def test_example_script_runs_unchanged_on_either_backend(where, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARTSDK_BACKEND": where,
           "ARTSDK_HOME": str(tmp_path / "client"), "ARTSDK_BACKEND_OPTIONS": '{"device": "cpu"}'}
    server = None
    if where == "remote":
        (tmp_path / "server").mkdir()
        server = Serve(tmp_path / "server", free_port()).start()
        env.update(ARTSDK_BACKEND_URL=server.url, ARTSDK_API_KEY=KEY, ARTSDK_BACKEND_OPTIONS="{}")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "examples.tic_tac_toe.train", "--steps", "1", "--base-model", "tiny",
             "--eval-games", "2", "--scenarios-per-step", "2", "--group-size", "2", "--warmup", "0"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        if server:
            server.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"({where} backend" in out.stdout and "step 1: reward" in out.stdout and "eval after 1 steps" in out.stdout
    drawn = int(re.search(r"\((\d+) scenarios drawn", out.stdout).group(1))  # the config's dynamic sampling
    assert 2 <= drawn <= 4  # the tiny model's games tie or not: a step draws up to twice what it asks for
    assert art.Store(tmp_path / "client" / "store.db").count(project="tic-tac-toe") == 2 + 2 * drawn + 2
