"""One bad request never hurts another, bad training input never moves a weight, and the
servers' limits hold: the local backend's server in-process and `artsdk serve` as a
subprocess, both on 127.0.0.1 with the tiny model."""

import asyncio
import json
import math
import socket
import time

import httpx
import pytest
import torch
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory

from backends import http as http_limits
from backends.local import LocalBackend
from backends.local.engine import Request
from tests.serve_process import KEY, Serve, free_port

pytestmark = pytest.mark.anyio
PROMPT = [{"role": "user", "content": "go"}]


@pytest.fixture
async def local(tmp_path, monkeypatch):
    """A local backend with its server, with short time limits so the slow-client tests end soon."""
    monkeypatch.setattr(http_limits, "BODY_TIMEOUT", 1.5)
    monkeypatch.setattr(http_limits.GuardedH11, "header_timeout", 1.5)
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"), docs=True)  # the spec test reads /openapi.json
    model = art.TrainableModel("h", base_model="tiny", project="hard")
    endpoint = await be.register(model)
    yield be, model, endpoint
    await be.close()


def key_of(endpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {endpoint.api_key}"}


def weights(be, name):
    return {k: v.detach().clone() for k, v in be.models[name].model.named_parameters() if ".policy." in k}


def groups_of(served, rewards=(1.0, 0.0), ids=(10, 11, 12), logprobs=None, prompt=None):
    prompt = prompt if prompt is not None else served.chat.prompt_ids(PROMPT)
    trajs = []
    for i, r in enumerate(rewards):
        t = trajectory([*PROMPT, {"role": "assistant", "content": "x"}], model=served.spec.name,
                       token_ids=[x + i for x in ids], logprobs=list(logprobs or [-2.0] * len(ids)))
        t.calls[0].prompt_token_ids = list(prompt)
        t.reward = r
        trajs.append(t)
    return [art.Group(trajectories=trajs)]


def nan_part(groups):
    """The first trajectory's reward made of parts, one of them NaN (so the total is NaN)."""
    t = groups[0].trajectories[0]
    t.rewards = {"won": math.nan, "format": 1.0}
    t.reward = sum(t.rewards.values())
    return groups


# -- isolation ----------------------------------------------------------------------------

async def test_a_poisoned_request_fails_alone(local):
    be, _, endpoint = local
    served = be.models["h"]
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    poisons = [{"temperature": float("nan")}, {"top_p": -1}, {"seed": 2**64}, {"max_tokens": 0},
               {"temperature": 7}, {"n": 0}, {"stop": ["x"] * 9}]
    for rnd, poison in enumerate(poisons):
        good = [client.chat.completions.create(model="h", messages=PROMPT, max_tokens=4, seed=i)
                for i in range(8)]
        body = json.dumps({"model": "h", "messages": PROMPT, "max_tokens": 4, **poison})  # NaN as JSON allows
        async with httpx.AsyncClient(headers=key_of(endpoint)) as raw:
            bad = raw.post(endpoint.base_url + "/chat/completions", content=body,
                           headers={"content-type": "application/json"})
            *answers, refused = await asyncio.gather(*good, bad)
        assert all(a.choices[0].model_extra["token_ids"] for a in answers), poison
        assert refused.status_code == 400, (poison, refused.text)
        field = next(iter(poison))
        assert refused.json()["error"]["param"] == field, refused.json()
    # a failure inside generation (past the edge's checks) fails that request and no other
    good = [Request(prompt=served.chat.prompt_ids(PROMPT), max_tokens=4, seed=i) for i in range(6)]
    broken = Request(prompt=served.chat.prompt_ids(PROMPT), max_tokens=4, temperature=float("nan"))
    futures = [served.submit(r) for r in good[:3]] + [served.submit(broken)] + [served.submit(r) for r in good[3:]]
    for i, f in enumerate(futures):
        if i == 3:
            with pytest.raises(RuntimeError):
                f.result(60)
        else:
            assert f.result(60)[0].token_ids
    assert served.pins == {}
    await client.close()


# -- no 500 from input --------------------------------------------------------------------

async def test_odd_model_names_are_400s_and_the_routes_are_in_the_spec(local):
    _, _, endpoint = local
    async with httpx.AsyncClient(base_url=endpoint.base_url, headers=key_of(endpoint)) as c:
        for name in ("h@²", "h@" + "9" * 5000, "h@-1", "h@1.0", "h@", "", "nope"):
            r = await c.post("/chat/completions", json={"model": name, "messages": PROMPT})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model", (name[:20], r.text[:200])
        r = await c.post("/chat/completions", json={"model": "h", "messages": "not a list"})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
        spec = (await c.get(endpoint.base_url.removesuffix("/v1") + "/openapi.json")).json()
    assert "/v1/chat/completions" in spec["paths"] and "/v1/models" in spec["paths"]


# -- limits -------------------------------------------------------------------------------

async def test_body_limit_counts_chunked_bytes_and_slow_clients_are_cut_off(local):
    _, _, endpoint = local
    host, port = endpoint.base_url.removeprefix("http://").removesuffix("/v1").split(":")

    async def chunks():  # 17 MB with no Content-Length (chunked), over the 16 MB limit
        for _ in range(17):
            yield b" " * (1024 * 1024)

    async with httpx.AsyncClient(timeout=60, headers=key_of(endpoint)) as c:
        r = await c.post(endpoint.base_url + "/chat/completions", content=chunks(),
                         headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text

    def raw(send_slowly: bytes, pause: float) -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            try:
                for b in send_slowly:
                    s.sendall(bytes([b]))
                    time.sleep(pause)
                return s.recv(1000)
            except (BrokenPipeError, ConnectionResetError):
                return b"<closed>"

    t0 = time.monotonic()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\n" % endpoint.api_key.encode())
    answer = await asyncio.to_thread(raw, head, 0.2)  # headers a byte every 0.2 s: past the 1.5 s limit
    assert answer in (b"", b"<closed>") and time.monotonic() - t0 < 8
    body = b'{"model": "h", "messages": [{"role": "user", "content": "hi"}]}'
    slow_body = head.replace(b"\r\nHost", b"\r\nContent-Length: %d\r\nHost" % len(body)) + b"\r\n" + body

    def raw_body() -> bytes:  # headers at once, then the body a byte every 0.1 s
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(slow_body[:-len(body)])
            try:
                for b in body:
                    s.sendall(bytes([b]))
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return s.recv(1000)

    assert b" 408 " in (await asyncio.to_thread(raw_body)).split(b"\r\n")[0]
    # the body deadline ends with the body: an answer may stream for longer
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    t0 = time.monotonic()
    stream = await client.chat.completions.create(model="h", messages=PROMPT, max_tokens=2000, stream=True,
                                                  extra_body={"min_tokens": 2000})
    finish = [c.choices[0].finish_reason async for c in stream if c.choices][-1]
    assert finish == "length" and time.monotonic() - t0 > 1.5
    await client.close()


def status_of_one_response(reader) -> bytes:
    """Read one whole HTTP/1.1 response (its headers, then Content-Length bytes of body) and
    return its status line: a body that arrives in a packet of its own is not taken for the
    next response's start. ``<closed>`` if the server closed the connection instead."""
    status = reader.readline().rstrip(b"\r\n")
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    reader.read(length)
    return status or b"<closed>"


async def test_an_idle_connection_outlives_the_clients_own_keep_alive(local):
    """httpx (and so the openai client) drops a connection idle for 5 s; a server that closed
    its own at 5 s raced it, and a request now and then went into a closing connection. The
    server keeps an idle connection past the client's 5 s: the same socket answers again at 6 s."""
    _, _, endpoint = local
    host, port = endpoint.base_url.removeprefix("http://").removesuffix("/v1").split(":")

    def twice() -> list[bytes]:
        answers = []
        with socket.create_connection((host, int(port)), timeout=10) as s, s.makefile("rb") as reader:
            for pause in (0, 6):
                time.sleep(pause)
                try:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    answers.append(status_of_one_response(reader))
                except (BrokenPipeError, ConnectionResetError):
                    answers.append(b"<closed>")
        return answers

    assert await asyncio.to_thread(twice) == [b"HTTP/1.1 200 OK"] * 2


# -- streams ------------------------------------------------------------------------------

async def test_a_cut_stream_is_stored_incomplete_and_fails_its_rollout(server, art_store):
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)

    @art.rollout
    async def reader() -> str:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "cut stream"}], stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream])

    @art.rollout
    async def leaves_early() -> str:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a long answer here"}], stream=True)
        async for chunk in stream:
            return chunk.choices[0].delta.content or ""

    assert await reader() == "half an"  # the agent saw nothing wrong
    groups = await art.gather(reader, [art.Args()], group_size=2)
    for t in groups[0]:
        call = t.calls[0]
        assert call.incomplete and "cut" in call.error and call.message["content"] == "half an"
        assert t.error is not None and t.error.type == "StreamCutError"
    stored = art_store.trajectories(rollout=reader.name)
    assert stored and all(s.calls[0].incomplete and s.error.type == "StreamCutError" for s in stored)
    # an agent that stops reading early is not a cut: incomplete, no error
    t = (await art.gather(leaves_early, [art.Args()]))[0][0]
    assert t.calls[0].incomplete and t.calls[0].error is None and t.error is None
    await client.close()


# -- training input -----------------------------------------------------------------------

async def test_bad_training_input_moves_no_weight(local, tmp_path):
    be, model, _ = local
    served = be.models["h"]
    before = weights(be, "h")
    ckpts = tmp_path / "home" / "hard" / "h" / "checkpoints"
    prompt = served.chat.prompt_ids(PROMPT)
    cases = {
        "reward nan": (groups_of(served, rewards=(math.nan, 0.0)), {}, art.TrajectoryError, "reward nan"),
        "reward inf": (groups_of(served, rewards=(math.inf, 0.0)), {}, art.TrajectoryError, "reward inf"),
        "reward 1e308": (groups_of(served, rewards=(1e308, 0.0)), {}, art.TrajectoryError, "finite"),
        "-inf logprob": (groups_of(served, logprobs=[-math.inf, -1, -1]), {"loss": "grpo"},
                         art.TrajectoryError, "logprob -inf"),
        "out of vocabulary": (groups_of(served, ids=(10, 11, 99_999)), {}, art.TrajectoryError, "vocabulary"),
        "negative id": (groups_of(served, ids=(-5, 11, 12)), {}, art.TrajectoryError, "vocabulary"),
        "too long": (groups_of(served, prompt=prompt * 400), {}, art.TrajectoryError, "context of 2048"),
        "lr nan": (groups_of(served), {"learning_rate": math.nan}, art.BackendError, "learning_rate"),
        "lr text": (groups_of(served), {"learning_rate": "abc"}, art.BackendError, "learning_rate"),
        "grad norm nan": (groups_of(served), {"max_grad_norm": math.nan}, art.BackendError, "max_grad_norm"),
        "lr huge": (groups_of(served), {"learning_rate": 1e3}, art.BackendError, "learning_rate"),
        "a part nan": (nan_part(groups_of(served)), {}, art.TrajectoryError, r"its reward part 'won' is nan"),
    }
    for name, (groups, cfg, error, words) in cases.items():
        with pytest.raises(error, match=words):
            await be.train(model, groups, **cfg)
        after = weights(be, "h")
        assert all(torch.equal(before[k], after[k]) for k in before), name
        assert served.step == 0 and not any(ckpts.iterdir()), name
    # past the checks: an update that makes a weight non-finite is undone
    from backends.local.trainer import TrainConfig, train_step

    with served.engine.lock:
        served.model.set_adapter("policy")
        params = [p for n, p in served.model.named_parameters() if ".policy." in n]

        class Wild(torch.optim.SGD):  # an update that overflows (as with a far too large step)
            def step(self, closure=None):
                super().step(closure)
                with torch.no_grad():
                    params[0].view(-1)[0] = math.inf

        wild = Wild(params, lr=1e-3)
        with pytest.raises(art.TrainingError, match="non-finite"):
            train_step(served.model, wild, groups_of(served), TrainConfig(), served.tokenizing(), "cpu")
    after = weights(be, "h")
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the model still answers, and still trains on good input
    r = served.submit(Request(prompt=prompt, max_tokens=4)).result(60)
    assert all(math.isfinite(x) for x in r[0].logprobs)
    assert (await be.train(model, groups_of(served))).step == 1


async def test_nothing_to_train_moves_nothing_and_says_why(local, tmp_path, art_store):
    be, model, _ = local
    served = be.models["h"]
    equal = groups_of(served, rewards=(0.5, 0.5))
    no_calls = [art.Group(trajectories=[trajectory(model="h", rewards={"r": r}) for r in (1.0, 0.0)])]
    failed = [art.Group(trajectories=[trajectory(model="h", error="boom") for _ in range(2)])]
    async with art.session(model, backend=be) as run:
        for groups, words in ((equal, "equal rewards"), (no_calls, "sampled tokens"), (failed, "2 failed")):
            result = await run.train(groups)
            assert not result.trained and result.step == 0 and result.checkpoint is None
            assert words in result.reason, result.reason
        assert run.step == 0 and art_store.steps("hard", "h") == []
        assert not any((tmp_path / "home" / "hard" / "h" / "checkpoints").iterdir())


# -- artsdk serve -------------------------------------------------------------------------

async def test_serve_refuses_odd_input_with_4xx(tmp_path):
    s = Serve(tmp_path, free_port()).start()
    h = {"Authorization": f"Bearer {KEY}"}
    try:
        async with httpx.AsyncClient(base_url=s.url, headers=h, timeout=120) as c:
            r = await c.post("/v1/art/models", json={"name": "v", "base_model": "tiny",
                                                     "config": {"lora": "rank"}})
            assert r.status_code == 400 and "lora" in r.text
            r = await c.post("/v1/art/models", json={"name": "v", "base_model": "/etc/passwd"})
            assert r.status_code == 400 and "cannot be loaded on this server" in r.text
            assert "JSON" not in r.text and "passwd" in r.text  # names what was asked, reveals nothing more
            other = await c.post("/v1/art/models", json={"name": "v", "base_model": "/no/such/dir"})
            assert other.status_code == 400  # a missing path reads the same as an existing non-model
            assert other.text.replace("/no/such/dir", "/etc/passwd") == r.text
            long = await c.post("/v1/art/models", json={"name": "v", "base_model": "b" * 300})
            assert long.status_code == 400 and "cannot be loaded" in long.text  # 500 ENAMETOOLONG before
            assert (await c.post("/v1/art/models", json={"name": "v", "base_model": "tiny"})).status_code == 200
            for step in ("9" * 301, "1.0", "-1", "1e3"):
                assert (await c.get(f"/v1/art/models/v/checkpoints/{step}")).status_code == 422, step
                assert (await c.delete(f"/v1/art/models/v/checkpoints/{step}")).status_code == 422, step
            spec = (await c.get("/openapi.json")).json()
            assert {"/v1/chat/completions", "/v1/models", "/v1/art/models"} <= set(spec["paths"])
            registry = (tmp_path / "serve" / "models.json").read_text()

            async def chunks():  # 300 MB, chunked, over the 256 MB limit
                for _ in range(300):
                    yield b" " * (1024 * 1024)

            r = await c.post("/v1/art/models", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413
            assert (tmp_path / "serve" / "models.json").read_text() == registry
    finally:
        s.stop()


async def test_serve_home_is_home_from_any_folder(tmp_path):
    home, a, b = tmp_path / "home", tmp_path / "a", tmp_path / "b"
    for d in (home, a, b):
        d.mkdir()
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    s = Serve(home, free_port(), key=None, cwd=a, args=["--api-key-file", str(key_file)]).start()
    h = {"Authorization": f"Bearer {KEY}"}
    try:
        async with httpx.AsyncClient(base_url=s.url, headers=h, timeout=120) as c:
            (await c.post("/v1/art/models", json={"name": "w", "base_model": "tiny"})).raise_for_status()
            from backends.remote import RemoteBackend

            be = RemoteBackend(s.url, api_key=KEY)
            spec = art.TrainableModel("w", base_model="tiny", project="default")
            t = trajectory([*PROMPT, {"role": "assistant", "content": "x"}], model="w",
                           token_ids=[10, 11], logprobs=[-2.0, -2.0])
            t.calls[0].prompt_token_ids = [1, 2, 3]
            groups = [art.Group(trajectories=[t.model_copy(update={"reward": r, "id": str(r)}) for r in (0.0, 1.0)])]
            assert (await be.train(spec, groups)).step == 1
            await be.close()
    finally:
        s.stop()
    assert list(a.iterdir()) == []  # nothing written to the working folder
    assert (home / "default" / "w" / "checkpoints" / "1" / "adapter_model.safetensors").is_file()
    s = Serve(home, free_port(), cwd=b).start()  # restarted from another folder, same --home
    try:
        async with httpx.AsyncClient(base_url=s.url, headers=h, timeout=120) as c:
            assert (await c.get("/v1/art/models/w")).json()["step"] == 1
    finally:
        s.stop()
