"""The ray backend on a Ray instance on this machine: two inference replicas and two trainer
ranks run the whole loop through the session API; a rollout's calls stay on one replica,
requests are pinned to their step, every replica serves a new step before the name moves to
it; two ranks make the step one process makes; a step submitted again is not made twice; bad
input is refused by name with nothing moved."""

import asyncio
import json
import tempfile
from pathlib import Path

import pytest
import torch

import artsdk as art

from tests.conftest import on_ray

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.anyio, on_ray]

TINY = "tiny"


@pytest.fixture(scope="module")
def ray_instance():
    from backends.ray.backend import RAY_SYSTEM_CONFIG

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
             _system_config=RAY_SYSTEM_CONFIG)
    yield
    ray.shutdown()


def backend(tmp_path, **options):
    from backends.ray import RayBackend

    return RayBackend(device="cpu", dtype="float32", home=str(tmp_path / "home"), health_interval_s=0.5,
                      **{"replicas": 2, "trainers": 2, **options})


def agent(client, max_tokens: int = 5):
    """A two-call rollout (the second call continues the first), shared with test_ray_faults."""
    @art.rollout
    async def talk(q: str) -> str:
        asked = [{"role": "user", "content": q}]
        first = await client.chat.completions.create(model="m", messages=asked, max_tokens=max_tokens)
        said = first.choices[0].message.content
        second = await client.chat.completions.create(
            model="m", max_tokens=max_tokens,
            messages=[*asked, {"role": "assistant", "content": said}, {"role": "user", "content": "and then?"}])
        return second.choices[0].message.content

    return talk


@art.reward
def first_token(t: art.Trajectory) -> float:  # differs within groups, so every step trains
    return float(t.calls[0].choices[0].token_ids[0] % 5)


def adapter_of(folder) -> torch.Tensor:
    from safetensors.torch import load_file

    weights = load_file(str(folder / "adapter_model.safetensors"))
    return torch.cat([weights[k].flatten() for k in sorted(weights)])


def scratch() -> set[str]:
    """The replicas' and ranks' scratch folders on this machine."""
    names = (p.name for p in Path(tempfile.gettempdir()).glob("artsdk-r*"))
    return {n for n in names if n.startswith(("artsdk-replica-", "artsdk-rank"))}


async def test_two_replicas_and_two_ranks_run_the_loop(ray_instance, tmp_path, art_store):
    from openai import AsyncOpenAI

    before = scratch()
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    talk = agent(client)
    be = backend(tmp_path)
    model = art.TrainableModel("m", base_model=TINY, project="p")
    try:
        async with art.session(model, backend=be) as run:
            for expected in (1, 2):
                groups = await art.gather(talk, [f"question {i}" for i in range(6)], group_size=4, rewards=[first_token])
                trajs = [t for g in groups for t in g]
                assert all(t.error is None for t in trajs)
                # every call pinned to the step that was newest when it was made
                assert {c.served_by for t in trajs for c in t.calls} == {f"m@{expected - 1}"}
                # the replicas' own records of the calls, by rollout, matched the client's one for one
                assert all(t.metadata["calls_recorded"] == {"client": 2, "endpoint": 2, "matched": 2,
                                                            "endpoint_only": 0, "client_only": 0} for t in trajs)
                result = await run.train(groups)
                assert result.trained and result.step == expected and result.metrics["updates"] >= 1
            status = be.status()["m"]
            pool = be.deployments["m"].pool
            # a Responses API continuation goes to the replica that keeps the response it continues
            raw = AsyncOpenAI(base_url=run.endpoint.base_url, api_key=run.endpoint.api_key, max_retries=0)
            firsts = await asyncio.gather(*(raw.responses.create(model="m", input=f"topic {i}", max_output_tokens=3)
                                            for i in range(8)))
            owners = {pool.owners[r.id] for r in firsts}
            seconds = await asyncio.gather(*(raw.responses.create(model="m", input="go on", previous_response_id=r.id,
                                                                  max_output_tokens=3) for r in firsts))
            assert owners == {0, 1} and all(r.model == "m@2" for r in seconds)
            await raw.close()
            # Anthropic's Messages API through the router: answers, streams, and errors in its shape
            anthropic = pytest.importorskip("anthropic")
            claude = anthropic.AsyncAnthropic(base_url=run.endpoint.base_url.removesuffix("/v1"),
                                              api_key=run.endpoint.api_key, max_retries=0)
            m = await claude.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
            assert m.model == "m@2" and m.model_extra["token_ids"]
            async with claude.messages.stream(model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}]) as s:
                assert (await s.get_final_message()).model == "m@2"
            with pytest.raises(anthropic.BadRequestError) as bad:
                await claude.messages.create(model="nope", max_tokens=3, messages=[{"role": "user", "content": "x"}])
            assert bad.value.body["error"]["type"] == "invalid_request_error" and "unknown model" in str(bad.value)
            await claude.close()

            @art.rollout
            async def by_url() -> list:  # a client artsdk does not patch, sent to the rollout's URL on the router
                import httpx

                async with httpx.AsyncClient(timeout=120) as h:
                    r = await h.post(f"{art.rollout_url()}/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                        headers={"Authorization": f"Bearer {run.endpoint.api_key}"})
                return r.json()["choices"][0]["token_ids"]

            (g,) = await art.gather(by_url, [art.Args()], group_size=1)
            (t,) = g.trajectories
            assert [c.choices[0].token_ids for c in t.calls] == [t.outcome] and t.calls[0].provider == "endpoint"
            # the router takes only the session's key (a fresh random one), on every route but /health
            import httpx

            root, key = run.endpoint.base_url.removesuffix("/v1"), run.endpoint.api_key
            assert key != "artsdk" and len(key) >= 22
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with httpx.AsyncClient(timeout=120) as h:
                assert (await h.get(f"{root}/health")).status_code == 200
                for path in ("/v1/chat/completions", "/v1/messages", f"/r/{t.id}/v1/chat/completions"):
                    for wrong in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "artsdk"}):
                        assert (await h.post(root + path, json=chat, headers=wrong)).status_code == 401, path
                for path in ("/v1/models", "/docs", "/openapi.json"):
                    assert (await h.get(root + path)).status_code == 401, path
                assert (await h.get(f"{root}/openapi.json", headers={"x-api-key": key})).status_code == 404
                # a call to the ended rollout's URL: the router passes it on, the replica refuses it
                late = await h.post(f"{root}/r/{t.id}/v1/chat/completions", json=chat,
                                    headers={"Authorization": f"Bearer {key}"})
                assert late.status_code == 410 and "has ended" in late.text, late.text
    finally:
        await be.close()
        await client.close()
    assert scratch() <= before  # the replicas and ranks removed their folders
    # both replicas answered, each serving the newest step, none failed
    assert [r["ready"] for r in status["replicas"]] == [True, True] and status["step"] == 2
    assert all(r["answered"] > 0 and r["failures"] == 0 and 2 in r["steps"] for r in status["replicas"])
    # a rollout's two calls went to one replica (the header artsdk sends names the rollout)
    by_rollout: dict[str, set[int]] = {}
    for key, replica, _ in pool.recent:
        if len(key) == 32 and key.isalnum():  # a rollout's id (the Responses calls above are keyed by their input)
            by_rollout.setdefault(key, set()).add(replica)
    assert len(by_rollout) == 2 * 6 * 4 + 1 and all(len(v) == 1 for v in by_rollout.values())  # + the by-URL one
    assert len({min(v) for v in by_rollout.values()}) == 2  # and the rollouts were spread over both
    # the checkpoints are the driver's, whole; the store has the steps
    assert be.checkpoint_steps(model) == [1, 2] and (be.checkpoint_dir(model, 2) / "optimizer.pt").is_file()
    assert [s["step"] for s in art_store.steps("p", "m")] == [1, 2]


@pytest.mark.parametrize("shard", ["none", "fsdp"])
async def test_two_ranks_train_what_one_local_process_trains(ray_instance, tmp_path, shard):
    """The same groups through the ray backend (2 ranks, several mini-batches and epochs) and the
    local backend (one process): the same loss, gradient norm and adapter afterwards. Sharded
    (FSDP), each rank holds half the model; a new driver's ranks take their shares of the
    checkpoint (adapter and optimizer state) and make the next step one process makes."""
    from backends.local import LocalBackend
    from tests.test_trust_region import batch

    settings = {"minibatches": 3, "epochs": 2, "learning_rate": 1e-2, "loss": "grpo", "tokens_per_row": 48}
    local = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "local"))
    model = art.TrainableModel("m", base_model=TINY, project="p", config={"train": settings})
    await local.register(model)
    groups = batch(local.models["m"], groups=4, size=4, length=7)
    one = await local.train(model, groups)
    start = local.models["m"].checkpoints.path(1)
    ray_be = backend(tmp_path, replicas=1, shard=shard)
    try:
        await ray_be.register(model)
        two = await ray_be.train(model, groups)
        if shard == "fsdp":
            held = [await r.info.remote() for r in ray_be.deployments["m"].ranks]
            await ray_be.close()
            ray_be = backend(tmp_path, replicas=1, shard=shard)  # a new driver, resuming at step 1
            await ray_be.register(model)
            assert await ray_be.step(model) == 1
            one_next, two_next = await local.train(model, groups), await ray_be.train(model, groups)
    finally:
        await ray_be.close()
        await local.close()
    assert one.step == two.step == 1 and two.metrics["rows"] >= 4
    for k in ("loss", "grad_norm", "clip_fraction", "ratio_mean", "tokens_trained", "updates"):
        assert two.metrics[k] == pytest.approx(one.metrics[k], rel=1e-4, abs=1e-6), k
    a, b = adapter_of(start), adapter_of(ray_be.checkpoint_dir(model, 1))
    base = adapter_of_initial(tmp_path)
    moved = (a - base).abs()
    assert moved.max() > 1e-3 and (a - b).abs().mean() < 1e-4 * moved.mean()
    if shard == "fsdp":
        assert two.metrics["rank_params_fraction"] <= 0.55
        assert all(0.45 < h["rank_params_fraction"] <= 0.55 for h in held) and len(held) == 2
        assert two_next.step == one_next.step == 2
        for k in ("loss", "grad_norm"):
            assert two_next.metrics[k] == pytest.approx(one_next.metrics[k], rel=1e-4, abs=1e-6), k
        a2, b2 = adapter_of(Path(one_next.checkpoint)), adapter_of(ray_be.checkpoint_dir(model, 2))
        assert (a2 - b2).abs().mean() < 1e-4 * (a2 - base).abs().mean()  # the noise of two steps of floats
    else:
        assert two.metrics["rank_params_fraction"] == 1.0


def adapter_of_initial(tmp_path) -> torch.Tensor:
    from backends.local.policy import Policy
    from backends.local.trainer import TrainConfig
    from pathlib import Path

    policy = Policy(art.TrainableModel("m", base_model=TINY), cache=Path.home() / ".cache" / "artsdk", device="cpu",
                    dtype=torch.float32, train_config=TrainConfig())
    from peft import get_peft_model_state_dict

    weights = get_peft_model_state_dict(policy.model, adapter_name="policy")
    return torch.cat([weights[k].flatten() for k in sorted(weights)])


async def test_a_step_submitted_again_is_not_made_twice_and_bad_input_moves_nothing(ray_instance, tmp_path):
    from tests.test_trust_region import batch

    be = backend(tmp_path, replicas=1)
    model = art.TrainableModel("m", base_model=TINY, project="p", config={"train": {"learning_rate": 1e-2}})
    try:
        await be.register(model)
        d = be.deployments["m"]
        local_groups = batch(await _served_tiny(tmp_path), groups=2, size=4)
        # the driver sends a step again (its answer was lost): each rank answers with the step it made
        first = await asyncio.gather(*(r.train.remote(1, local_groups, {}) for r in d.ranks))
        again = await asyncio.gather(*(r.train.remote(1, local_groups, {}) for r in d.ranks))
        assert first == again
        await d._commit(1, first[0])
        once = adapter_of(be.checkpoint_dir(model, 1))
        assert [await r.info.remote() for r in d.ranks][0]["step"] == 1
        # and after the commit too: no second update
        assert await d.ranks[0].train.remote(1, local_groups, {}) == first[0]
        # a trajectory whose reward is not finite: refused by name on every rank, nothing moved
        bad = batch(await _served_tiny(tmp_path), groups=1, size=2)
        bad[0].trajectories[0].reward = float("nan")
        with pytest.raises(art.TrajectoryError, match="rewards must be finite") as e:
            await be.train(model, bad)
        assert bad[0].trajectories[0].id in str(e.value)
        with pytest.raises(art.BackendError, match="learning_rate"):
            await be.train(model, local_groups, learning_rate=-1)
        ok = await be.train(model, local_groups)
        assert ok.step == 2 and await be.step(model) == 2
        assert (adapter_of(be.checkpoint_dir(model, 2)) - once).abs().max() > 0
    finally:
        await be.close()


_TINY: dict = {}


async def _served_tiny(tmp_path):
    """A tiny model's served form (its tokenizer and name), for making groups."""
    if "m" not in _TINY:
        from backends.local import LocalBackend

        be = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "tok"), http=False)
        await be.register(art.TrainableModel("m", base_model=TINY))
        _TINY["m"] = be.models["m"]
    return _TINY["m"]


def test_options_are_checked_by_name(tmp_path):
    from backends.ray import RayBackend

    with pytest.raises(art.BackendError, match="replicas must be a whole number >= 1"):
        RayBackend(replicas=0)
    with pytest.raises(art.BackendError, match="unknown shard 'zero3'.*fsdp"):
        RayBackend(shard="zero3")
    with pytest.raises(art.BackendError, match="trainer_gpus must be a number >= 0"):
        RayBackend(trainer_gpus=-1)
    with pytest.raises(art.BackendError, match="placement 'EVERYWHERE'"):
        RayBackend(placement="EVERYWHERE")
    with pytest.raises(art.BackendError, match=r"colocated.*replicas \(3\) can be at most trainers \(2\)"):
        RayBackend(replicas=3, trainers=2, colocate=True)
    with pytest.raises(art.BackendError, match="colocate must be true or false, got 'yes'"):
        RayBackend(colocate="yes")
    from backends.ray.replica import _sharing

    vllm = {"engine": "vllm", "vllm": {"gpu_memory_utilization": 0.4}, "colocated": True}
    assert _sharing({**vllm, "device": "cuda"}) == {"sleep": True, "gpu_memory_utilization": 0.4}  # beside a rank
    assert _sharing({**vllm, "device": "cpu"}) == {"gpu_memory_utilization": 0.4}  # no sleep mode on CPUs
    from artsdk.backend import available_backends

    assert available_backends()["ray"] == "backends.ray:RayBackend"  # chosen by configuration: backend = "ray"
    assert json.loads(json.dumps(RayBackend(replicas=2, replica_gpus=1).replica_shape))["num_gpus"] == 1


def test_no_address_starts_ray_here_whatever_cluster_this_machine_last_recorded():
    """Unset, ``address`` means a Ray instance of the backend's own on this machine (docs/scale.md),
    even where Ray has recorded another cluster as the machine's current one (``ray start``, a
    ray.cluster_utils.Cluster, one since gone): ray.init() would try to join that one, and refuse
    the CPUs asked for ("When connecting to an existing cluster, num_cpus ... must not be
    provided"). Here a dead cluster is recorded, in a Ray temp folder of the test's own. Its workers
    run at the driver's priority: at Ray's default (nice 15) the replicas and ranks wait behind any
    busy process on the machine."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as temp:  # short: Ray's socket paths live in it
        (Path(temp) / "ray").mkdir()
        (Path(temp) / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")  # a cluster since gone
        code = ("import os, ray\n"
                "from backends.ray import RayBackend\n"
                "be = RayBackend(replicas=1, trainers=1)\n"
                "be._connect()\n"
                "print(ray.get(ray.remote(lambda: os.nice(0)).remote()))\n"
                "print(ray.get_runtime_context().gcs_address)\n"
                "ray.shutdown()\n")
        run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=240,
                             env={**{k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"},
                                  "RAY_TMPDIR": temp, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr[-2000:]
    nice, address = run.stdout.split()[-2:]
    assert address != "127.0.0.1:9"  # an instance of its own
    # whose workers run at the driver's priority, not Ray's nice 15 (they would wait behind any busy process)
    assert nice == "0"


def test_the_skypilot_task_file_is_one_that_runs(tmp_path):
    """deploy/skypilot.yaml (docs/scale.md): its backend options are the ray backend's, its
    vLLM options parse, its extras exist, and its training command is the example's."""
    import re
    import shlex
    import tomllib
    from pathlib import Path

    import yaml

    from backends.local.vllm_engine import VLLMOptions
    from backends.ray import RayBackend
    from examples.email_agent.train import EXAMPLE
    from examples.runner import load_config

    root = Path(__file__).resolve().parent.parent
    task = yaml.safe_load((root / "deploy" / "skypilot.yaml").read_text())
    assert task["num_nodes"] >= 2 and "accelerators" in task["resources"]
    assert task["envs"]["ARTSDK_BACKEND"] == "ray"
    options = json.loads(task["envs"]["ARTSDK_BACKEND_OPTIONS"])
    be = RayBackend(home=str(tmp_path), **options)  # checked as the driver checks them
    assert be.replicas == options["replicas"] and be.trainers == options["trainers"] and be.address == "auto"
    VLLMOptions.parse(options["vllm"])
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = re.search(r'pip install -e "\.\[([a-z,]+)\]"', task["setup"]).group(1).split(",")
    assert set(wanted) <= set(extras)
    command = next(line for line in task["run"].replace("\\\n", " ").splitlines() if "examples." in line)
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "examples.email_agent.train"]
    cfg = load_config(EXAMPLE.config, args[3:])
    assert cfg["base_model"].startswith("Qwen/") and cfg["warmup"] == 0 and cfg["steps"] > 10
    assert "ray start --head" in task["run"] and 'ray start --address="$HEAD:6379"' in task["run"]


async def test_a_replica_that_cannot_load_a_step_is_drained_not_served_stale(ray_instance, tmp_path):
    import shutil
    from pathlib import Path

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    talk = agent(client)
    be = backend(tmp_path, trainers=1)
    model = art.TrainableModel("m", base_model=TINY, project="p")
    try:
        async with art.session(model, backend=be) as run:
            groups = await art.gather(talk, [f"q{i}" for i in range(4)], group_size=4, rewards=[first_token])
            d = be.deployments["m"]
            broken = d.pool.replicas[1]
            folder = Path((await broken.actor.info.remote())["checkpoints"])
            shutil.rmtree(folder)
            folder.write_text("not a folder")  # replica 1 can no longer write a step's files
            assert (await run.train(groups)).step == 1
            status = be.status()["m"]["replicas"]
            assert status[0]["ready"] and 1 in status[0]["steps"]
            assert not status[1]["ready"] and 1 not in status[1]["steps"]  # drained
            groups = await art.gather(talk, [f"r{i}" for i in range(8)], group_size=2, rewards=[first_token])
            assert {c.served_by for g in groups for t in g for c in t.calls} == {"m@1"}  # none stale
            assert be.status()["m"]["replicas"][1]["ready"] is False  # its set-up keeps failing: still out
            folder.unlink()  # repaired: the health check sets it up with step 1 and lets it back in
            deadline = asyncio.get_running_loop().time() + 60
            while not be.status()["m"]["replicas"][1]["ready"]:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.5)
            assert 1 in be.status()["m"]["replicas"][1]["steps"]
    finally:
        await be.close()
        await client.close()


async def test_a_step_cancelled_while_the_ranks_train_is_absent(ray_instance, tmp_path):
    """Ctrl-C (the caller cancelled) while the ranks train: the ranks stop together within a
    mini-batch (the step asked for would take hours), no checkpoint, the name stays on the last
    step, the ranks' weights are put back, and the next step is made from there."""
    from tests.test_trust_region import batch

    be = backend(tmp_path, replicas=1)
    model = art.TrainableModel("m", base_model=TINY, project="p",
                               config={"train": {"learning_rate": 1e-2, "epochs": 8, "minibatches": 4}})
    served = await _served_tiny(tmp_path)
    small, large = batch(served, groups=2, size=4), batch(served, groups=16, size=8, length=40)
    try:
        await be.register(model)
        assert (await be.train(model, small)).step == 1
        d = be.deployments["m"]
        # 10,000 epochs: still under way at the cancel however fast the machine, and far past the
        # test's timeout unless the ranks stop when asked
        step = asyncio.ensure_future(be.train(model, large, epochs=10_000))
        await asyncio.sleep(1.5)
        assert not step.done()
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        assert be.checkpoint_steps(model) == [1] and await be.step(model) == 1
        infos = [await r.info.remote() for r in d.ranks]
        assert [(i["step"], i["pending"]) for i in infos] == [(1, None)] * 2  # the ranks put their weights back
        # the weights were put back: training the small batch again gives what step 2 gives from step 1
        again = await be.train(model, small)
        assert again.step == 2
        reference = backend(tmp_path / "ref", replicas=1)
        ref_model = model.model_copy(update={"name": "m"})
        try:
            await reference.register(ref_model)
            await reference.train(ref_model, small)
            want = await reference.train(ref_model, small)
        finally:
            await reference.close()
        assert again.metrics["loss"] == pytest.approx(want.metrics["loss"], rel=1e-5, abs=1e-7)
    finally:
        await be.close()


async def test_a_model_unregistered_while_its_step_trains_never_writes_into_its_successor(ray_instance, tmp_path):
    from tests.test_trust_region import batch

    be = backend(tmp_path, replicas=1, trainers=1)
    model = art.TrainableModel("m", base_model=TINY, project="p")
    served = await _served_tiny(tmp_path)
    try:
        await be.register(model)
        step = asyncio.ensure_future(be.train(model, batch(served, groups=2, size=4), epochs=4000))
        await asyncio.sleep(2.0)
        assert not step.done()
        await be.unregister(model)  # returns once the step has let go
        await be.register(model, fresh=True)
        with pytest.raises(art.BackendError, match="unregistered while this step trained"):
            await step
        assert be.checkpoint_steps(model) == [] and await be.step(model) == 0
    finally:
        await be.close()


async def test_a_step_published_while_16_long_requests_are_in_flight_interrupts_none(ray_instance, tmp_path):
    """The replica loads the new step's adapter between two tokens of the batch it is decoding:
    the step is published before those requests end, none of them is stopped or changed (each
    finishes, whole, on the step it was pinned to), and the next request gets the new step."""
    import time

    from openai import AsyncOpenAI

    from tests.test_trust_region import batch

    be = backend(tmp_path, replicas=1, trainers=1)
    model = art.TrainableModel("m", base_model=TINY, project="p", config={"train": {"learning_rate": 1e-2}})
    try:
        endpoint = await be.register(model)
        groups = batch(await _served_tiny(tmp_path), groups=2, size=4)
        assert (await be.train(model, groups)).step == 1
        client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        long = {"model": "m", "messages": [{"role": "user", "content": "tell me everything"}], "max_tokens": 800,
                "extra_body": {"min_tokens": 800}, "temperature": 1.0, "stream": True,
                "stream_options": {"include_usage": True}}
        started = asyncio.Event()
        first_seen = 0

        async def read(stream) -> tuple[int, str, set, float]:
            """The stream read as it comes: its tokens, finish reason, models, when it ended."""
            nonlocal first_seen
            n, reason, models = 0, None, set()
            async for chunk in stream:
                if not models:
                    first_seen += 1
                    if first_seen == 16:
                        started.set()
                models.add(chunk.model)
                if chunk.usage is not None:
                    n = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
            return n, reason, models, time.monotonic()

        d = be.deployments["m"]
        made = await d.ranks[0].train.remote(2, groups, {})  # step 2, made and not yet published
        streams = [await client.chat.completions.create(**long) for _ in range(16)]
        readers = [asyncio.create_task(read(s)) for s in streams]
        await asyncio.wait_for(started.wait(), 120)  # all 16 are being decoded
        step, metrics, _ = await d._commit(2, made)  # writes step 2, loads it on the replica, routes to it
        published = time.monotonic()
        fresh = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2)
        answered = time.monotonic()
        assert step == 2 and metrics["replicas_serving"] == 1.0 and fresh.model == "m@2"
        answers = await asyncio.gather(*readers)
        assert all(reason == "length" and models == {"m@1"} and n == 800 for n, reason, models, _ in answers), [
            a[:3] for a in answers]
        # the step was published while all 16 were still going (the built-in engine answers the next
        # request after the batch in flight: it batches between batches)
        ended = min(a[3] for a in answers)
        assert published < ended and answered > published, (ended - published, metrics["seconds_publish"])
        await client.close()
    finally:
        await be.close()


async def test_a_drained_replica_is_let_back_in_within_seconds_while_another_is_set_up(ray_instance, tmp_path):
    """Health checks ask every replica at once and set-ups run on their own: while replica 1's
    set-up takes long (held here for 40 s), replica 0, drained by a failed call, is let back in
    at the next check once it answers. A set-up past ``setup_timeout_s`` is given up."""
    import threading
    import time

    be = backend(tmp_path, trainers=1)
    model = art.TrainableModel("m", base_model=TINY, project="p")
    try:
        await be.register(model)
        d = be.deployments["m"]
        r0, r1 = d.pool.replicas
        real, held = d._set_up, threading.Event()

        def slow_set_up(r):  # what a replica loading a large model looks like to the health check
            if r is r1:
                held.set()
                time.sleep(40)
            real(r)

        d._set_up = slow_set_up
        with d.pool.lock:
            r1.incarnation = "lost"  # as after a restart: replica 1 must be set up again
        await asyncio.to_thread(held.wait, 30)
        with d.pool.lock:
            r0.ready = False  # what the router does when a call to it fails
        t0 = time.monotonic()
        while not r0.ready:
            assert time.monotonic() - t0 < 5, "replica 0 waited behind replica 1's set-up"
            await asyncio.sleep(0.1)
        assert not r1.ready  # still being set up
    finally:
        await be.close()
    with pytest.raises(art.BackendError, match="setup_timeout_s=0.01"):
        await backend(tmp_path, replicas=1, trainers=1, setup_timeout_s=0.01).register(model)
