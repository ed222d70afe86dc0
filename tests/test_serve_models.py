"""`artsdk serve` keeps models apart: a model deleted while its step trains never writes into
the folder of the model registered after it under the same name, and a training request id
belongs to the model it was sent to. A real `artsdk serve` subprocess, the tiny model."""

import asyncio
import json

import httpx
import pytest

import artsdk as art
from artsdk.testing import trajectory
from tests.serve_process import KEY, Serve, free_port

pytestmark = pytest.mark.anyio
H = {"Authorization": f"Bearer {KEY}"}


def groups_json(model: str) -> list[dict]:
    trajs = []
    for i, r in enumerate((1.0, 0.0)):
        t = trajectory([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}], model=model,
                       token_ids=[10 + i, 11], logprobs=[-2.0, -2.0])
        t.calls[0].prompt_token_ids = [1, 2, 3]
        t.reward = r
        trajs.append(t)
    return [json.loads(art.Group(trajectories=trajs).model_dump_json())]


async def events(c: httpx.AsyncClient, name: str, body: dict) -> list[dict]:
    async with c.stream("POST", f"/v1/art/models/{name}/train", json=body) as r:
        assert r.status_code == 200, await r.aread()
        return [json.loads(line) async for line in r.aiter_lines() if line.strip()]


async def test_a_model_deleted_while_it_trains_never_writes_into_its_successor(tmp_path):
    srv = Serve(tmp_path, free_port()).start()
    folder = tmp_path / "default" / "m" / "checkpoints"
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers=H, timeout=300) as c:
            (await c.post("/v1/art/models", json={"name": "m", "base_model": "tiny"})).raise_for_status()
            # a long step: many epochs over the batch (a second or more on any machine)
            long = asyncio.ensure_future(events(c, "m", {"request_id": "long-step-1", "groups": groups_json("m"),
                                                         "config": {"epochs": 3000}}))
            await asyncio.sleep(1.5)
            assert not long.done()
            (await c.delete("/v1/art/models/m")).raise_for_status()  # returns once the step let go
            r = await c.post("/v1/art/models", json={"name": "m", "base_model": "tiny", "fresh": True})
            assert r.status_code == 200 and r.json()["step"] == 0
            last = (await long)[-1]
            assert last["event"] == "error" and "unregistered while this step trained" in last["message"]
            await asyncio.sleep(1.0)
            assert not [p for p in folder.iterdir() if p.name.isdigit()]  # the new model's folder holds no step
    finally:
        srv.stop()
    srv = Serve(tmp_path, free_port()).start()  # restarted: the fresh model is still fresh
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers=H, timeout=300) as c:
            assert (await c.get("/v1/art/models/m")).json()["step"] == 0
    finally:
        srv.stop()


async def test_a_request_id_belongs_to_the_model_it_was_sent_to(tmp_path):
    srv = Serve(tmp_path, free_port()).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers=H, timeout=300) as c:
            for name in ("m1", "m2"):
                (await c.post("/v1/art/models", json={"name": name, "base_model": "tiny"})).raise_for_status()
            one = await events(c, "m1", {"request_id": "same-id-123", "groups": groups_json("m1")})
            assert one[-1]["event"] == "done" and one[-1]["step"] == 1 and not one[-1]["replayed"]
            two = await events(c, "m2", {"request_id": "same-id-123", "groups": groups_json("m2")})
            assert two[-1]["event"] == "done" and two[-1]["step"] == 1 and not two[-1]["replayed"]  # m1's, before
            assert (await c.get("/v1/art/models/m2")).json()["step"] == 1
            again = await events(c, "m1", {"request_id": "same-id-123", "groups": groups_json("m1")})
            assert again[-1]["replayed"] and again[-1]["step"] == 1  # a retry to m1 is still m1's answer
            assert (await c.get("/v1/art/models/m1")).json()["step"] == 1
            # deleted and registered again: the id is forgotten with the model
            (await c.delete("/v1/art/models/m2")).raise_for_status()
            (await c.post("/v1/art/models", json={"name": "m2", "base_model": "tiny", "fresh": True})).raise_for_status()
            new = await events(c, "m2", {"request_id": "same-id-123", "groups": groups_json("m2")})
            assert new[-1]["step"] == 1 and not new[-1]["replayed"]
    finally:
        srv.stop()


def strict(line: str) -> dict:
    """A JSON line parsed as any strict parser would: NaN and Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


async def test_training_events_are_strict_json_and_step_bodies_are_bounded_before_they_are_built(tmp_path):
    srv = Serve(tmp_path, free_port()).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers=H, timeout=300) as c:
            (await c.post("/v1/art/models", json={"name": "m", "base_model": "tiny"})).raise_for_status()
            unscored = groups_json("m")
            for t in unscored[0]["trajectories"]:
                t["reward"] = None  # nothing scored: the step's mean reward is not a number
            async with c.stream("POST", "/v1/art/models/m/train",
                                json={"request_id": "unscored-1", "groups": unscored}) as r:
                lines = [line async for line in r.aiter_lines() if line.strip()]
            done = strict(lines[-1])  # "reward_mean": NaN before
            assert done["event"] == "done" and done["metrics"]["reward_mean"] is None and not done["trained"]
            from backends.remote import RemoteBackend

            be = RemoteBackend(srv.url, api_key=KEY)  # the client reads the null back as NaN
            spec = art.TrainableModel("m", base_model="tiny", project="default")
            result = await be.train(spec, [art.Group.model_validate(g) for g in unscored])
            assert result.metrics["reward_mean"] != result.metrics["reward_mean"] and not result.trained
            await be.close()

            many = '{"request_id": "many-groups", "groups": [' + ",".join(['{"trajectories": []}'] * 1_000_000) + "]}"
            r = await c.post("/v1/art/models/m/train", content=many, headers={"content-type": "application/json"})
            assert r.status_code == 422 and "1000000 groups in one step; at most 10000" in r.text
            wide = {"request_id": "many-trajs", "groups": [{"trajectories": [{}] * 20_000}] * 6}
            r = await c.post("/v1/art/models/m/train", json=wide)
            assert r.status_code == 422 and "120000 trajectories in one step; at most 100000" in r.text
            r = await c.post("/v1/art/models/m/sft", json={"request_id": "many-sft-1", "trajectories": [{}] * 100_001})
            assert r.status_code == 422 and "100001 trajectories" in r.text
            assert (await c.get("/v1/art/models/m")).json()["step"] == 0
    finally:
        srv.stop()
