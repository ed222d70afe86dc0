"""Checkpoints committed where another driver can take the run over (backends/shared_storage.py):
a shared folder, or S3 -- here a real S3-compatible server (moto's) on 127.0.0.1. A step counts
once its manifest is written; one cut short is never resumed from; files that do not match their
manifest are refused by name. A driver killed mid-run is followed by a new one, on another home,
that resumes at the last committed step and goes on from there, never making a step twice."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import artsdk as art
from artsdk.errors import CheckpointError
from backends.shared_storage import SharedCheckpoints
from tests.conftest import on_ray

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def s3():
    """A local S3-compatible server with a bucket; the AWS variables that reach it."""
    pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    import boto3

    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket="runs")
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(params=["folder", "s3"])
def url(request, tmp_path):
    if request.param == "s3":
        request.getfixturevalue("s3")
        return f"s3://runs/{tmp_path.name}"
    return str(tmp_path / "shared")


def test_a_step_counts_once_its_manifest_is_written_and_is_read_back_whole(url):
    shared = SharedCheckpoints(url, "p", "m")
    assert shared.steps() == []
    shared.put(1, {"adapter_model.safetensors": b"w1", "trainer_state.json": b"{}"})
    shared.put(2, {"adapter_model.safetensors": b"w2", "trainer_state.json": b"{}"})
    assert shared.steps() == [1, 2] and shared.get(2)["adapter_model.safetensors"] == b"w2"
    # a driver that died while writing step 3: its files are there, its manifest is not
    shared._files.write("3/adapter_model.safetensors", b"half")
    assert SharedCheckpoints(url, "p", "m").steps() == [1, 2]
    # a file changed after its commit is refused by name
    shared._files.write("2/adapter_model.safetensors", b"w2, then changed")
    with pytest.raises(CheckpointError, match="2/adapter_model.safetensors does not match its manifest"):
        shared.get(2)
    shared.remove(1)
    assert shared.steps() == [2]
    assert SharedCheckpoints(url, "p", "other").steps() == []  # by project and model


def test_bad_urls_are_refused_by_name(tmp_path, s3):
    with pytest.raises(art.BackendError, match="give a folder .* or s3://bucket/prefix"):
        SharedCheckpoints("gs://somewhere", "p", "m")
    with pytest.raises(art.BackendError, match="'s3://missing-bucket/x/p/m': the bucket cannot be reached"):
        SharedCheckpoints("s3://missing-bucket/x", "p", "m")
    (tmp_path / "file").write_text("")
    with pytest.raises(art.BackendError, match="cannot be written"):
        SharedCheckpoints(str(tmp_path / "file"), "p", "m")


@on_ray
async def test_a_driver_killed_mid_run_is_taken_over_at_the_last_committed_step(s3, tmp_path):
    ray = pytest.importorskip("ray")
    from backends.ray import RayBackend
    from backends.ray.backend import RAY_SYSTEM_CONFIG
    from tests.test_trust_region import batch

    url = "s3://runs/taken-over"
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _system_config=RAY_SYSTEM_CONFIG)
    try:
        address = ray.get_runtime_context().gcs_address
        driver = subprocess.Popen([sys.executable, "-m", "tests.ray_driver", address, str(tmp_path / "a"), url, "2"],
                                  cwd=ROOT, env={**os.environ, **s3}, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        said = []
        deadline = time.monotonic() + 600
        while "training" not in said:
            line = driver.stdout.readline().strip()
            assert line or driver.poll() is None, f"the driver ended early: {said}"
            said.append(line)
            assert time.monotonic() < deadline, said
        os.killpg(driver.pid, signal.SIGKILL)  # mid-step: step 3 was training
        driver.wait(30)
        assert said[-3:] == ["committed 1", "committed 2", "training"]
        shared = SharedCheckpoints(url, "p", "m")
        assert shared.steps() == [1, 2]  # step 3 never committed
        # a new driver, with none of the old one's files, takes the run over at step 2
        model = art.TrainableModel("m", base_model="tiny", project="p", config={"train": {"learning_rate": 1e-2}})
        be = RayBackend(address=address, device="cpu", dtype="float32", home=str(tmp_path / "b"), replicas=1,
                        trainers=1, checkpoints_url=url, health_interval_s=0.5)
        tokens = None
        try:
            await be.register(model)
            assert await be.step(model) == 2
            assert be.checkpoint_dir(model, 2).is_dir()
            from backends.local import LocalBackend

            tokens = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "tokens"), http=False)
            await tokens.register(model)
            groups = batch(tokens.models["m"], groups=2, size=4)
            result = await be.train(model, groups)
            assert result.step == 3 and shared.steps() == [1, 2, 3]
            assert (await be.train(model, groups)).step == 4
            assert shared.steps() == [2, 3, 4]  # the newest keep_checkpoints (3) stay committed
            # a fresh start over committed steps would mix two runs: refused by name
            with pytest.raises(art.BackendError, match="steps \\[2, 3, 4\\] committed at s3://runs/taken-over"):
                await RayBackend(address=address, home=str(tmp_path / "c"), checkpoints_url=url).register(
                    model, fresh=True)
        finally:
            await be.close()
            if tokens is not None:
                await tokens.close()
    finally:
        ray.shutdown()
