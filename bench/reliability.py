"""What the servers and the store promise under bad input, faults and crashes, counted: the
figures of docs/reliability.md. Everything runs on 127.0.0.1 with the tiny model.

    python -m bench.reliability [--rounds 20] [--rollouts 400] [--crashes 3]

- isolation: rounds of 8 good chat requests sent together with 1 poisoned one;
- auth: every route of `artsdk serve`'s spec with no key, a wrong key and odd spellings;
- faults: rollouts whose calls fail (HTTP 400), are cut mid-stream, or whose agent code
  raises, 32 at a time through `art.gather` with retries: every attempt stored, no call in
  the wrong trajectory;
- crashes: `artsdk serve` killed with SIGKILL in the middle of training steps, then
  restarted: the step it comes back at, and every checkpoint on disk whole;
- fuzz: the OpenAPI-driven fuzzing of tests/test_fuzz.py, its requests and answers counted.

Writes bench/results/reliability.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing import trajectory
from bench.common import save_result
from artsdk.testing.mock_server import MockServer
from tests.serve_process import KEY, Serve, free_port

POISONS = [{"temperature": float("nan")}, {"top_p": -1}, {"seed": 2**64}, {"max_tokens": 0},
           {"n": 1000}, {"model": "x@\u00b2"}, {"messages": "hi"}, {"stop": ["s"] * 9}]


async def isolation(rounds: int, home: str) -> dict:
    from backends.local import LocalBackend

    be = LocalBackend(device="cpu", home=home)
    endpoint = await be.register(art.TrainableModel("iso", base_model="tiny"))
    good_ok = good_total = bad_4xx = bad_5xx = 0
    async with httpx.AsyncClient(base_url=endpoint.base_url, timeout=60,
                                 headers={"Authorization": f"Bearer {endpoint.api_key}"}) as c:
        for r in range(rounds):
            body = {"model": "iso", "messages": [{"role": "user", "content": f"round {r}"}], "max_tokens": 6}
            good = [c.post("/chat/completions", json={**body, "seed": i}) for i in range(8)]
            bad = c.post("/chat/completions", content=json.dumps({**body, **POISONS[r % len(POISONS)]}),
                         headers={"content-type": "application/json"})
            *answers, refused = await asyncio.gather(*good, bad)
            good_total += len(answers)
            good_ok += sum(a.status_code == 200 for a in answers)
            bad_4xx += 400 <= refused.status_code < 500
            bad_5xx += refused.status_code >= 500
    await be.close()
    return {"rounds": rounds, "good_requests": good_total, "good_answered": good_ok,
            "poisoned_4xx": bad_4xx, "poisoned_5xx": bad_5xx}


def auth(serve: Serve) -> dict:
    spec = httpx.get(serve.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    keys = [None, "Bearer wrong", f"bearer {KEY}", f"Bearer  {KEY}", f"Bearer {KEY[:-1]}", KEY, "", f"Basic {KEY}"]
    tried = bypassed = 0
    with httpx.Client(base_url=serve.url, timeout=30) as c:
        for path, ops in spec["paths"].items():
            if path == "/health":
                continue
            concrete = path.replace("{name}", "m").replace("{step}", "1")
            for method in ops:
                for key in keys:
                    headers = {} if key is None else {"Authorization": key}
                    r = c.request(method.upper(), concrete, headers=headers, json={})
                    tried += 1
                    bypassed += r.status_code != 401
    return {"requests": tried, "not_refused": bypassed}


async def faults(server: MockServer, rollouts: int, store: art.Store) -> dict:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    made = Counter()

    @art.rollout
    async def flaky(i: int) -> str:
        rng = random.Random(f"{i}-{made[i]}")
        made[i] += 1
        kind = rng.choice(["ok", "ok", "http 400", "cut stream", "raise"])
        tag = f"rollout {i} attempt {made[i]}"
        first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": tag}])
        if kind == "http 400":
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "bad json " + tag}])
        elif kind == "cut stream":
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "cut stream " + tag}], stream=True)
            _ = [c async for c in stream]
        elif kind == "raise":
            raise RuntimeError("the agent's own code failed")
        return first.choices[0].message.content

    t0 = time.monotonic()
    groups = await art.gather(flaky, range(rollouts), retries=2, concurrency=32, store=store)
    seconds = time.monotonic() - t0
    await client.close()
    stored = store.trajectories(rollout=flaky.name, limit=10 * rollouts)
    wrong = 0
    for t in stored:
        i = t.scenario["i"]
        wrong += sum(f"rollout {i} " not in json.dumps(c.messages) for c in t.calls)
    return {"rollouts": rollouts, "attempts_made": sum(made.values()), "attempts_stored": len(stored),
            "calls_stored": sum(len(t.calls) for t in stored), "calls_in_wrong_trajectory": wrong,
            "failed_after_retries": sum(g.errors for g in groups), "seconds": seconds}


async def crashes(n: int, home: Path) -> dict:
    from backends.remote import RemoteBackend

    serve = Serve(home, free_port()).start()
    model = art.TrainableModel("crash", base_model="tiny", project="reliability")
    t = trajectory([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}], model="crash",
                   token_ids=[5, 6, 7], logprobs=[-6.0] * 3)
    t.calls[0].prompt_token_ids = [1, 2, 3, 4]
    group = art.Group(trajectories=[t.model_copy(update={"reward": float(r), "id": str(r)}) for r in (0, 1)])
    results = []
    for k in range(n):
        be = RemoteBackend(serve.url, api_key=KEY, retries=0)
        await be.register(model)
        before = await be.step(model)
        await be.train(model, [group])  # one whole step
        task = asyncio.create_task(be.train(model, [group] * 2000))  # a long one, killed in the middle
        await asyncio.sleep(1.5 + 0.5 * k)
        serve.stop(signal.SIGKILL)
        try:
            await task
        except art.BackendError:
            pass
        await be.close()
        serve = Serve(home, free_port()).start()
        be = RemoteBackend(serve.url, api_key=KEY)
        await be.register(model)
        after = await be.step(model)
        folder = home / "reliability" / "crash" / "checkpoints"
        whole = all((p / "adapter_model.safetensors").is_file() and (p / "trainer_state.json").is_file()
                    for p in folder.iterdir() if p.is_dir())
        leftovers = [p.name for p in folder.iterdir() if ".tmp" in p.name]
        results.append({"step_before": before, "step_after_restart": after, "checkpoints_whole": whole,
                        "temporary_folders_left": leftovers})
        await be.close()
    serve.stop()
    return {"kills": n, "runs": results,
            "came_back_at_a_complete_step": sum(r["step_after_restart"] in (r["step_before"] + 1, r["step_before"] + 2)
                                                and r["checkpoints_whole"] and not r["temporary_folders_left"]
                                                for r in results)}


def fuzz(home: Path) -> dict:
    import schemathesis

    from tests.test_fuzz import fuzz as run_fuzz

    serve = Serve(home, free_port()).start()
    h = {"Authorization": f"Bearer {KEY}"}
    try:
        httpx.post(serve.url + "/v1/art/models", headers=h, json={"name": "m", "base_model": "tiny"},
                   timeout=120).raise_for_status()
        failures, statuses = run_fuzz(schemathesis.openapi.from_url(serve.url + "/openapi.json", headers=h),
                                      serve.url, timeout=120)
    finally:
        serve.stop()
    return {"requests": sum(statuses.values()), "answers_5xx": len(failures),
            "by_status": {str(k): v for k, v in sorted(statuses.items())}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--rollouts", type=int, default=400)
    ap.add_argument("--crashes", type=int, default=3)
    a = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        art.configure(home=str(root / "home"), store=str(root / "store.db"), progress=False)
        out["isolation"] = asyncio.run(isolation(a.rounds, str(root / "iso")))
        print("isolation", out["isolation"], flush=True)
        (root / "auth").mkdir()
        serve = Serve(root / "auth", free_port()).start()
        try:
            out["auth"] = auth(serve)
        finally:
            serve.stop()
        print("auth", out["auth"], flush=True)
        with MockServer() as server:
            out["faults"] = asyncio.run(faults(server, a.rollouts, art.default_store()))
        print("faults", out["faults"], flush=True)
        (root / "crash").mkdir()
        out["crashes"] = asyncio.run(crashes(a.crashes, root / "crash"))
        print("crashes", out["crashes"], flush=True)
        (root / "fuzz").mkdir()
        out["fuzz"] = fuzz(root / "fuzz")
        print("fuzz", out["fuzz"], flush=True)
    save_result("reliability", out)


if __name__ == "__main__":
    main()
