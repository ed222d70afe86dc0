"""The vLLM engine's own edges: its options are checked before anything starts, a vLLM that
fails to start says why with the end of its log, and what it cannot serve is refused by
name. (Answers, streaming, hot-swap and training with it run in the engine-parametrised
tests: test_local_server.py, test_local_training.py, test_training_numerics.py,
test_examples.py.)"""

import pytest

import artsdk as art
from artsdk.errors import BackendError, ModelLoadError
from tests.conftest import needs_vllm, on_vllm

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402

pytestmark = [pytest.mark.anyio, on_vllm]


@pytest.mark.parametrize("options, culprit", [
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"kv_cache_gb": 0}, "kv_cache_gb"),
    ({"max_loras": "four"}, "max_loras"),
    ({"args": "--enforce-eager"}, "args"),
    ({"gpus": 0}, "gpus"),
    ({"memory": 3}, "unknown vllm option"),
])
def test_bad_options_are_refused_by_name(tmp_path, options, culprit):
    with pytest.raises(BackendError, match=culprit):
        LocalBackend(device="cpu", home=str(tmp_path), engine="vllm", vllm=options)


def test_engine_is_one_of_two_and_its_options_need_it(tmp_path):
    with pytest.raises(BackendError, match="unknown engine 'sglang'"):
        LocalBackend(device="cpu", home=str(tmp_path), engine="sglang")
    with pytest.raises(BackendError, match="vllm options are set but engine is not"):
        LocalBackend(device="cpu", home=str(tmp_path), vllm={"kv_cache_gb": 2})
    with pytest.raises(BackendError, match="serve_only needs engine"):
        LocalBackend(device="cpu", home=str(tmp_path), serve_only=True)


@needs_vllm
async def test_a_vllm_that_fails_to_start_says_why_with_its_log(tmp_path):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"), engine="vllm",
                      vllm={"args": ["--no-such-flag"], "log": str(tmp_path / "v.log")})
    with pytest.raises(ModelLoadError, match=r"(?s)vLLM exited with code -?\d+ while starting.*v\.log.*unrecognized arguments: --no-such-flag"):
        await be.register(art.TrainableModel("m", base_model="tiny"))
    assert be.models == {}  # nothing half-loaded is kept
    await be.close()


@needs_vllm
def test_no_vllm_outlives_a_killed_run(tmp_path):
    """kill -9 of the process that started vLLM: vLLM's processes go too, within seconds."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "import anyio, os, signal, artsdk as art\n"
        "from backends.local import LocalBackend\n"
        "async def main():\n"
        f"    be = LocalBackend(device='cpu', home={str(tmp_path / 'home')!r}, engine='vllm')\n"
        "    await be.register(art.TrainableModel('m', base_model='tiny'))\n"
        "    print(be.models['m'].engine.process.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "anyio.run(main)\n")
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    pid = int(run.stdout.split()[0])
    for _ in range(300):
        try:
            os.killpg(pid, 0)  # vLLM's process group: its server and its engine processes
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(pid, signal.SIGKILL)
        raise AssertionError("vLLM outlived the run that started it")


@needs_vllm
async def test_the_model_s_generation_config_does_not_change_what_vllm_samples(tmp_path):
    """vLLM fills every sampling setting a request leaves out from the model's
    generation_config.json (Qwen ships top_k 20 and a repetition penalty): then the served
    distribution is not the one the trainer scores. A model that asks for top_k 1 and a
    repetition penalty must still be sampled at plain temperature 1, its logprobs the trainer's."""
    import json

    import torch

    from backends.local.tiny import build_tiny
    from tests.test_trust_region import completion_logprobs

    folder = build_tiny(tmp_path / "tiny-with-defaults")
    (folder / "generation_config.json").write_text(json.dumps({"top_k": 1, "repetition_penalty": 1.8,
                                                               "min_p": 0.5}))
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"), engine="vllm")
    await be.register(art.TrainableModel("g", base_model=str(folder)))
    served = be.models["g"]
    from backends.local.engine import Request

    prompt = served.chat.prompt_ids([{"role": "user", "content": "go"}])
    outs = served.submit(Request(prompt=prompt, max_tokens=6, n=12, temperature=1.0, seed=3)).result(300)
    assert len({tuple(o.token_ids) for o in outs}) > 6  # top_k 1 from the model's config: all alike
    for o in outs:
        with torch.no_grad():
            trainer = completion_logprobs(served, prompt, o.token_ids)
        assert (trainer - torch.tensor(o.logprobs)).abs().max() < 1e-3  # was 0.0 for every token (top_k 1)
    await be.close()


@needs_vllm
async def test_served_only_no_weights_here_and_a_step_trained_elsewhere_is_served_as_trained(tmp_path):
    """``serve_only`` (what a ray replica on vLLM is): this process loads no weights -- vLLM's
    process has them -- and a step trained by another backend, its adapter files handed over,
    is loaded into the running vLLM and sampled with the trainer's own logprobs for it."""
    import torch

    from backends.local.engine import Request
    from tests.test_trust_region import batch, completion_logprobs

    trainer = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "trainer"), http=False)
    model = art.TrainableModel("m", base_model="tiny", config={"train": {"learning_rate": 1e-2}})
    await trainer.register(model)
    trained = trainer.models["m"]
    result = await trainer.train(model, batch(trained, groups=2, size=4))
    files = trained.checkpoints.files(result.step)
    server = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "server"), engine="vllm", serve_only=True,
                          http=False)
    try:
        await server.register(model)
        served = server.models["m"]
        assert served.model is None and served.optimizer is None  # no copy of the weights in this process
        with pytest.raises(BackendError, match="only served here"):
            await server.train(model, batch(trained, groups=1, size=2))
        folder = served.checkpoints.write(result.step, files)
        served._publish(result.step, folder)
        served._advance(result.step)
        prompt = served.chat.prompt_ids([{"role": "user", "content": "go"}])
        (out,) = served.submit(Request(prompt=prompt, max_tokens=8, temperature=1.0, seed=1)).result(300)
        with torch.no_grad():
            trained.model.set_adapter("policy")  # the trainer's weights are step 1's
            theirs = completion_logprobs(trained, prompt, out.token_ids)
            with trained.model.disable_adapter():
                base = completion_logprobs(trained, prompt, out.token_ids)
        ours = torch.tensor(out.logprobs)
        assert (theirs - ours).abs().max() < 1e-3 < (base - ours).abs().max()  # step 1's adapter, not the base
    finally:
        await server.close()
        await trainer.close()
