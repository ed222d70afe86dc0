"""The ray backend's faults, on a Ray cluster of several nodes on this machine
(``ray.cluster_utils.Cluster``): a replica's node removed during rollouts (its calls go to the
other replica; Ray restarts it on another node, where it loads the current adapter before it
takes traffic), and a trainer rank killed during a step (the step is absent, and the run goes
on from the last checkpoint). Placement across nodes: sharded ranks a node each, and colocated
replicas sharing their ranks' nodes and sleeping while the ranks train."""

import asyncio
import os
import signal
import time

import pytest

import artsdk as art
from tests.conftest import on_ray
from tests.test_ray import agent, first_token

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900), on_ray]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    from backends.ray.backend import RAY_SYSTEM_CONFIG

    # at the backend's priority: Ray's own (nice 15) starves the replicas beside another busy process
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trainer_slot": 2},
                                                      "_system_config": RAY_SYSTEM_CONFIG})
    nodes = [c.add_node(num_cpus=1, resources={"replica_slot": 1}) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def backend(tmp_path, **options):
    from backends.ray import RayBackend

    return RayBackend(device="cpu", dtype="float32", home=str(tmp_path / "home"), health_interval_s=0.5,
                      **{"replicas": 2, "trainers": 1, "replica_resources": {"replica_slot": 1},
                         "trainer_resources": {"trainer_slot": 1}, **options})


async def wait_until(check, seconds=180.0, poll=0.5):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(poll)


async def test_a_replica_node_lost_during_rollouts(cluster, tmp_path):
    from openai import AsyncOpenAI

    c, nodes = cluster
    client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused", max_retries=0)
    talk = agent(client, max_tokens=8)
    be = backend(tmp_path)
    model = art.TrainableModel("m", base_model="tiny", project="p")
    try:
        async with art.session(model, backend=be) as run:
            groups = await art.gather(talk, [f"warm {i}" for i in range(4)], group_size=4, rewards=[first_token])
            assert (await run.train(groups)).step == 1
            before = be.status()["m"]["replicas"]
            # rollouts under way, then one replica's node goes; a fresh node can take its place
            gathering = asyncio.ensure_future(art.gather(talk, [f"q {i}" for i in range(16)], group_size=4))
            # remove the node while every replica has calls in flight (a fixed sleep lost the race on a
            # fast machine: the rollouts were over before the node went, and nothing had to be sent again)
            await wait_until(lambda: gathering.done() or all(r["inflight"] for r in be.status()["m"]["replicas"]),
                             poll=0.02)
            assert not gathering.done(), "the rollouts ended before both replicas had calls in flight"
            c.remove_node(nodes[0])
            nodes[0] = c.add_node(num_cpus=1, resources={"replica_slot": 1})
            groups = await gathering
            trajs = [t for g in groups for t in g]
            assert [t.error for t in trajs if t.error is not None] == []  # every call answered
            # and some of them only because they were sent again: the lost replica failed calls in flight
            failed = [r["failures"] for r in be.status()["m"]["replicas"]]
            assert sum(failed) >= 1, failed
            assert {c.served_by for t in trajs for c in t.calls} == {"m@1"}
            # Ray restarts the replica elsewhere; it is set up with step 1 before it takes traffic
            # (wait for the restart itself: just after the loss, status may still show the old replica ready)
            def restarted_and_ready() -> bool:
                now = be.status()["m"]["replicas"]
                return all(r["ready"] for r in now) and any(n["incarnation"] != b["incarnation"]
                                                            for n, b in zip(now, before))

            await wait_until(restarted_and_ready)
            after = be.status()["m"]["replicas"]
            restarted = [i for i in range(2) if after[i]["incarnation"] != before[i]["incarnation"]]
            assert len(restarted) == 1 and 1 in after[restarted[0]]["steps"]
            answered = after[restarted[0]]["answered"]
            more = await art.gather(talk, [f"again {i}" for i in range(16)], group_size=2, rewards=[first_token])
            assert all(t.error is None for g in more for t in g)
            assert be.status()["m"]["replicas"][restarted[0]]["answered"] > answered  # and it takes traffic
            assert (await run.train(more)).step == 2  # training goes on
    finally:
        await be.close()
        await client.close()


async def test_a_trainer_rank_killed_during_a_step(cluster, tmp_path):
    from tests.test_ray import _served_tiny
    from tests.test_trust_region import batch

    be = backend(tmp_path, replicas=1, trainers=2)
    model = art.TrainableModel("m", base_model="tiny", project="p",
                               config={"train": {"learning_rate": 1e-2, "epochs": 8, "minibatches": 4}})
    served = await _served_tiny(tmp_path)
    small, large = batch(served, groups=2, size=4), batch(served, groups=16, size=8, length=40)
    try:
        await be.register(model)
        assert (await be.train(model, small)).step == 1
        d = be.deployments["m"]
        pid = (await d.ranks[1].info.remote())["pid"]
        # a step of thousands of optimizer steps: it is still under way when the rank dies, however fast
        # the machine (8 epochs of this batch take under 2 s on some); it is abandoned, so it costs nothing
        step = asyncio.ensure_future(be.train(model, large, epochs=4000))
        await asyncio.sleep(2.0)
        assert not step.done()  # the step is under way
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(art.BackendError, match=r"trainer rank 1 of .m. failed during step 2 \(The actor died[^\n]*\); the step was abandoned .* started again from step 1"):
            await step
        assert be.checkpoint_steps(model) == [1] and await be.step(model) == 1  # the step is absent
        assert be.status()["m"]["routing_step"] == 1
        # the ranks were started again from the checkpoint: the run goes on
        assert [(await r.info.remote())["step"] for r in d.ranks] == [1, 1]
        assert (await be.train(model, small)).step == 2 and be.checkpoint_steps(model) == [1, 2]
    finally:
        await be.close()


async def test_a_lost_rank_with_no_room_to_start_again_is_a_backend_error_until_a_node_is_added(cluster, tmp_path):
    """Two ranks, each on a node of its own; one node goes and no other has room for a rank: the
    step is abandoned with a BackendError naming what the cluster lacks, and so is every step
    after it (never a bare error from inside), until a node with room is added -- then the
    ranks are placed again, from the last checkpoint, and training goes on."""
    from tests.test_ray import _served_tiny
    from tests.test_trust_region import batch

    c, _ = cluster
    rooms = [c.add_node(num_cpus=1, resources={"rank_room": 1}) for _ in range(2)]
    be = backend(tmp_path, replicas=1, trainers=2, trainer_resources={"rank_room": 1}, placement="STRICT_SPREAD",
                 wait_s=10.0)
    model = art.TrainableModel("m", base_model="tiny", project="p")
    small = batch(await _served_tiny(tmp_path), groups=2, size=4)
    try:
        await be.register(model)
        assert (await be.train(model, small)).step == 1
        c.remove_node(rooms[1])
        with pytest.raises(art.BackendError, match=r"failed during step 2 .*could not start again: the cluster could "
                                                   r"not place 2 trainer rank\(s\) of .*rank_room"):
            await be.train(model, small)
        with pytest.raises(art.BackendError, match=r"could not place 2 trainer rank\(s\) of .*'rank_room': 1"):
            await be.train(model, small)  # still no room: said again, by name
        rooms[1] = c.add_node(num_cpus=1, resources={"rank_room": 1})
        assert (await be.train(model, small)).step == 2 and be.checkpoint_steps(model) == [1, 2]
    finally:
        await be.close()
        for node in rooms:
            if node in c.list_all_nodes():
                c.remove_node(node)


async def test_two_sharded_ranks_on_two_nodes_train_what_one_process_trains(cluster, tmp_path):
    """``shard = "fsdp"`` over two nodes: each rank on a node of its own holds about half the
    base model's parameters, and the step is the one one process makes (loss and gradient norm
    within 1e-5)."""
    from backends.local import LocalBackend
    from tests.test_ray import TINY
    from tests.test_trust_region import batch

    c, _ = cluster
    rooms = [c.add_node(num_cpus=1, resources={"shard_room": 1}) for _ in range(2)]
    c.wait_for_nodes()
    settings = {"minibatches": 2, "epochs": 1, "learning_rate": 1e-2, "loss": "grpo", "tokens_per_row": 48}
    model = art.TrainableModel("m", base_model=TINY, project="p", config={"train": settings})
    local = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "local"))
    be = backend(tmp_path, replicas=1, trainers=2, trainer_resources={"shard_room": 1}, placement="STRICT_SPREAD",
                 shard="fsdp")
    try:
        await local.register(model)
        groups = batch(local.models["m"], groups=4, size=4, length=7)
        one = await local.train(model, groups)
        await be.register(model)
        two = await be.train(model, groups)
        held = [await r.info.remote() for r in be.deployments["m"].ranks]
    finally:
        await be.close()
        await local.close()
        for node in rooms:
            c.remove_node(node)
    assert len({h["node"] for h in held}) == 2  # a node each
    assert {h["node"] for h in held} <= {n.node_id for n in rooms}
    assert all(0.45 < h["rank_params_fraction"] <= 0.55 for h in held)
    for k in ("loss", "grad_norm"):
        assert two.metrics[k] == pytest.approx(one.metrics[k], abs=1e-5), k


async def test_colocated_replicas_sleep_in_their_ranks_bundles_while_the_ranks_train(cluster, tmp_path):
    """``colocate = true``: replica i is placed in rank i's bundle (here each pair on a node of
    its own). During a step every replica sleeps and a request made meanwhile is held, pinned
    to the step that was newest when it was made, and answered once the replicas woke; a step
    refused for bad data wakes them too."""
    from openai import AsyncOpenAI

    from tests.test_ray import _served_tiny
    from tests.test_trust_region import batch

    c, _ = cluster
    rooms = [c.add_node(num_cpus=2, resources={"pair_room": 2}) for _ in range(2)]
    c.wait_for_nodes()
    be = backend(tmp_path, replicas=2, trainers=2, colocate=True, placement="STRICT_SPREAD",
                 replica_resources={"pair_room": 1}, trainer_resources={"pair_room": 1})
    model = art.TrainableModel("m", base_model="tiny", project="p", config={"train": {"learning_rate": 1e-2}})
    hi = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    try:
        endpoint = await be.register(model)
        client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        d = be.deployments["m"]
        replicas = [await r.actor.info.remote() for r in d.pool.replicas]
        ranks = [await r.info.remote() for r in d.ranks]
        assert [r["node_id"] for r in replicas] == [r["node"] for r in ranks]  # a pair shares a bundle
        assert len({r["node"] for r in ranks}) == 2 and {r["node"] for r in ranks} <= {n.node_id for n in rooms}

        groups = batch(await _served_tiny(tmp_path), groups=16, size=8, length=32)  # a step of a few seconds
        step = asyncio.create_task(be.train(model, groups))
        while not all([(await r.actor.info.remote())["asleep"] for r in d.pool.replicas]):
            assert not step.done(), "the step ended before both replicas were seen asleep"
            await asyncio.sleep(0.005)
        assert be.status()["m"]["asleep"]
        held = asyncio.create_task(client.chat.completions.create(**hi))
        while be.status()["m"]["asleep"]:
            assert not held.done()  # not answered while the replicas sleep
            await asyncio.sleep(0.01)
        result = await step
        answer = await held
        assert result.step == 1 and result.metrics["replicas_asleep"] == 2.0, result.metrics
        assert answer.model == "m@0" and answer.choices[0].message.content  # the step newest when it was made
        assert not any([(await r.actor.info.remote())["asleep"] for r in d.pool.replicas])
        assert (await client.chat.completions.create(**hi)).model == "m@1"

        bad = batch(await _served_tiny(tmp_path), groups=1, size=2)
        bad[0].trajectories[0].reward = float("nan")
        with pytest.raises(art.TrajectoryError, match="rewards must be finite"):
            await be.train(model, bad)
        assert not be.status()["m"]["asleep"]
        assert (await asyncio.wait_for(client.chat.completions.create(**hi), 30)).model == "m@1"
        await client.close()
    finally:
        await be.close()
        for node in rooms:
            c.remove_node(node)
