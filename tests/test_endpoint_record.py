"""No call to the trainable model is lost, whatever makes it: the local backend's endpoint
records every call it answers by rollout, and at the end of a rollout its record and the
client's are reconciled. Calls from a process pool (fork and spawn), a ``curl`` subprocess, a
raw ``httpx`` post to the rollout's URL, a bare ``_thread`` and a ``ThreadPool`` made before
the rollout all land on the trajectory with their exact token ids; a call made after the
rollout returned is reported; under strict capture a rollout whose records disagree fails."""

import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
import shutil
import subprocess
import threading
import _thread
from multiprocessing.pool import ThreadPool

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

import artsdk as art
from backends.local import LocalBackend

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "hello"}]


def ask_in_child(env: dict) -> list[int]:
    """In another process: a plain openai client aimed by the rollout's environment."""
    client = OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "from a child"}],
                                       max_tokens=4, temperature=0)
    return r.choices[0].model_extra["token_ids"]


@pytest.fixture
async def session(tmp_path, art_store):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("m", base_model="tiny", project="e")
    async with art.session(model, backend=be) as run:
        yield run, be
    await be.close()


def token_ids_of(traj, provider):
    return [c.choices[0].token_ids for c in traj.calls if c.provider == provider]


async def test_calls_from_processes_curl_httpx_and_foreign_threads_land_on_the_trajectory(session):
    run, be = session
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    sync_client = OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    early_pool = ThreadPool(2)  # made before the rollout: its threads are not the rollout's
    sent: dict[str, list] = {}

    def in_thread(label: str) -> None:
        r = sync_client.chat.completions.create(model="m", messages=ASK, max_tokens=3, temperature=0)
        sent[label] = r.choices[0].model_extra["token_ids"]

    @art.rollout
    async def agent() -> str:
        r = await client.chat.completions.create(model="m", messages=ASK, max_tokens=3, temperature=0)
        sent["patched"] = r.choices[0].model_extra["token_ids"]
        env = art.rollout_env()
        assert env["OPENAI_BASE_URL"].endswith(f"/r/{env['ARTSDK_ROLLOUT']}/v1")
        # other processes: a pool of each start method, given the rollout's environment
        for method in ("fork", "spawn"):
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
                sent[method] = await asyncio.wrap_future(pool.submit(ask_in_child, env))
        # curl, as a shell tool would
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "from curl"}], "max_tokens": 4,
                           "temperature": 0})
        done = await asyncio.to_thread(subprocess.run, [
            shutil.which("curl"), "-s", "-X", "POST", f"{env['OPENAI_BASE_URL']}/chat/completions",
            "-H", f"Authorization: Bearer {env['OPENAI_API_KEY']}", "-H", "Content-Type: application/json",
            "-d", body], capture_output=True, text=True, timeout=120)
        sent["curl"] = json.loads(done.stdout)["choices"][0]["token_ids"]
        # an unpatched HTTP client posting to the rollout's URL
        async with httpx.AsyncClient(timeout=120) as h:
            resp = await h.post(f"{art.rollout_url()}/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "from httpx"}], "max_tokens": 4,
                "temperature": 0}, headers={"Authorization": f"Bearer {env['OPENAI_API_KEY']}"})
        sent["httpx"] = resp.json()["choices"][0]["token_ids"]
        # threads the rollout did not start through threading: a bare _thread and an earlier ThreadPool
        finished = threading.Event()
        _thread.start_new_thread(lambda: (in_thread("_thread"), finished.set()), ())
        await asyncio.to_thread(finished.wait, 120)
        await asyncio.to_thread(early_pool.apply, in_thread, ("pool",))
        return "ok"

    (group,) = await art.gather(agent, [art.Args()], group_size=1)
    (t,) = group.trajectories
    early_pool.close()
    await client.close()
    assert t.error is None, t.error
    # patched calls (the rollout's own, the _thread's and the early pool's) by the client, matched by the endpoint
    assert sorted(token_ids_of(t, "openai")) == sorted([sent["patched"], sent["_thread"], sent["pool"]])
    # the rest only the endpoint saw: added from its record, token for token
    assert sorted(token_ids_of(t, "endpoint")) == sorted([sent["fork"], sent["spawn"], sent["curl"], sent["httpx"]])
    assert t.metadata["calls_recorded"] == {"client": 3, "endpoint": 7, "matched": 3, "endpoint_only": 4,
                                            "client_only": 0}
    assert not any("differ" in w or "escaped" in w for w in t.warnings), t.warnings
    for c in t.calls:  # each trains token-exactly: prompt and sampled ids, served_by the step
        assert c.served_by == "m@0" and c.prompt_token_ids and c.choices[0].trainable
    assert [c.index for c in t.calls] == list(range(7))


async def test_endpoint_calls_train_like_captured_ones(session):
    run, be = session

    @art.rollout
    async def agent(i: int) -> str:
        env = art.rollout_env()
        return str(await asyncio.to_thread(lambda: _curl_like(env, i)))

    @art.reward
    def by_first_token(t: art.Trajectory) -> float:
        return float(t.calls[0].choices[0].token_ids[0] % 7)

    groups = await art.gather(agent, [0, 1], group_size=4, rewards=[by_first_token])
    assert all(len(t.calls) == 1 and t.calls[0].provider == "endpoint" for g in groups for t in g)
    assert any(not g.no_signal for g in groups)  # sampled at temperature 1: rewards differ within a group
    result = await run.train(groups)
    assert result.trained and result.metrics["tokens_trained"] > 0


def _curl_like(env: dict, i: int) -> int:
    r = httpx.post(f"{env['OPENAI_BASE_URL']}/chat/completions", headers={
        "Authorization": f"Bearer {env['OPENAI_API_KEY']}"}, json={
        "model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4, "temperature": 1.0},
        timeout=120)
    return r.json()["choices"][0]["token_ids"][0]


async def test_a_call_after_the_rollout_returned_is_reported(session, caplog):
    run, be = session
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    env_box: dict = {}
    started = asyncio.Event()

    @art.rollout
    async def agent() -> str:
        env_box.update(art.rollout_env())
        # a task the rollout does not wait for
        env_box["task"] = asyncio.create_task(client.chat.completions.create(model="m", messages=ASK, max_tokens=3))
        started.set()
        return "returned at once"

    caplog.set_level(logging.INFO)
    (group,) = await art.gather(agent, [art.Args()], group_size=1)
    await env_box["task"]  # it finishes after the rollout: on no trajectory, and said so
    await asyncio.to_thread(httpx.post, f"{env_box['OPENAI_BASE_URL']}/chat/completions",
                            headers={"Authorization": f"Bearer {env_box['OPENAI_API_KEY']}"},
                            json={"model": "m", "messages": ASK, "max_tokens": 2}, timeout=120)
    (t,) = group.trajectories
    assert t.calls == []
    logs = caplog.text
    assert "started after its rollout" in logs and t.id in logs  # the client's record
    assert f"arrived for rollout {t.id} after it had ended" in logs  # the endpoint's
    assert be.calls.late >= 1
    await client.close()


async def test_strict_capture_fails_a_rollout_whose_records_disagree(session):
    run, be = session
    art.configure(strict_capture=True)
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent() -> str:
        await client.chat.completions.create(model="m", messages=ASK, max_tokens=2)
        # a call numbered as the patch numbers its calls, which the client never made
        root = art.rollout_url().rsplit("/r/", 1)[0]
        from artsdk.capture.context import current_recorder

        await asyncio.to_thread(httpx.post, f"{root}/v1/chat/completions", json={
            "model": "m", "messages": ASK, "max_tokens": 2}, timeout=120, headers={
            "Authorization": f"Bearer {run.endpoint.api_key}", "X-Artsdk-Rollout": current_recorder.get().rollout_id,
            "X-Artsdk-Call": "5"})
        return "done"

    (group,) = await art.gather(agent, [art.Args()], group_size=1)
    (t,) = group.trajectories
    assert t.error is not None and t.error.type == "CaptureError"
    assert "call(s) numbered [5]" in t.error.message and t.metadata["calls_recorded"]["endpoint_only"] == 1
    await client.close()


async def test_concurrent_calls_are_numbered_in_the_order_they_were_made(session):
    run, be = session
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent() -> str:
        # the first asks for many tokens, the second for one: the second finishes first
        await asyncio.gather(
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}], max_tokens=40,
                                           extra_body={"min_tokens": 40}),
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "short"}], max_tokens=1))
        return "ok"

    (group,) = await art.gather(agent, [art.Args()], group_size=1)
    (t,) = group.trajectories
    assert [c.messages[0]["content"] for c in t.calls] == ["long", "short"]  # was ["short", "long"]
    assert t.metadata["calls_recorded"]["matched"] == 2
    await client.close()


def test_rollout_env_outside_a_rollout_or_a_session_says_what_is_needed():
    with pytest.raises(art.RolloutError, match="inside a rollout"):
        art.rollout_env()

    @art.rollout
    def agent() -> dict:
        return art.rollout_env()

    with pytest.raises(art.RolloutError, match="open art.session"):
        agent()


async def test_artsdk_serve_records_and_reconciles_the_same_way(tmp_path, art_store):
    from backends.remote import RemoteBackend
    from tests.serve_process import KEY, Serve, free_port

    srv = Serve(tmp_path, free_port()).start()
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    try:
        be = RemoteBackend(srv.url, api_key=KEY)
        async with art.session(art.TrainableModel("m", base_model="tiny", project="e"), backend=be):
            @art.rollout
            async def agent() -> list:
                await client.chat.completions.create(model="m", messages=ASK, max_tokens=3)
                async with httpx.AsyncClient(timeout=120) as h:
                    r = await h.post(f"{art.rollout_url()}/chat/completions", headers={
                        "Authorization": f"Bearer {art.rollout_env()['OPENAI_API_KEY']}"}, json={
                        "model": "m", "messages": [{"role": "user", "content": "raw"}], "max_tokens": 3})
                return r.json()["choices"][0]["token_ids"]

            (group,) = await art.gather(agent, [art.Args()], group_size=1)
        await be.close()
    finally:
        srv.stop()
        await client.close()
    (t,) = group.trajectories
    assert t.metadata["calls_recorded"] == {"client": 1, "endpoint": 2, "matched": 1, "endpoint_only": 1,
                                            "client_only": 0}
    assert t.calls[1].provider == "endpoint" and t.calls[1].choices[0].token_ids == t.outcome
    assert t.calls[1].messages == [{"role": "user", "content": "raw"}]
