"""A checkpoint that cannot be read (truncated, garbled) is an error that names its step and
file and offers the newest step that can be read -- in process and as a 4xx from `artsdk
serve` -- and resuming from that step is one argument, the later steps moved aside, never
deleted. Before, each library raised its own error (SafetensorError, a PytorchStreamReader
failure, a JSON decode error) and the server answered 500."""

import httpx
import pytest

import artsdk as art
from artsdk.errors import CheckpointError
from artsdk.testing import trajectory
from backends.local import LocalBackend
from tests.serve_process import KEY, Serve, free_port

pytestmark = pytest.mark.anyio
PROMPT = [{"role": "user", "content": "go"}]


def groups_for(name: str, prompt: list[int]) -> list[art.Group]:
    trajs = []
    for i, r in enumerate((1.0, 0.0)):
        t = trajectory([*PROMPT, {"role": "assistant", "content": "x"}], model=name,
                       token_ids=[10 + i, 11, 12], logprobs=[-2.0] * 3)
        t.calls[0].prompt_token_ids = list(prompt)
        t.reward = r
        trajs.append(t)
    return [art.Group(trajectories=trajs)]


async def two_steps(home, name: str = "c", project: str = "default") -> art.TrainableModel:
    """A model trained for two steps by the local backend in ``home``."""
    model = art.TrainableModel(name, base_model="tiny", project=project)
    be = LocalBackend(device="cpu", home=str(home), http=False)
    async with art.session(model, backend=be) as run:
        prompt = be.models[name].chat.prompt_ids(PROMPT)
        for _ in range(2):
            assert (await run.train(groups_for(name, prompt))).trained
    await be.close()
    return model


def damage(path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else b"\x00garbage" + data[8:])


@pytest.mark.parametrize("name,how", [("adapter_model.safetensors", "truncate"), ("optimizer.pt", "truncate"),
                                      ("trainer_state.json", "truncate"), ("adapter_model.safetensors", "garble")])
async def test_a_damaged_newest_checkpoint_names_itself_and_offers_the_one_before(tmp_path, art_store, name, how):
    home = tmp_path / "home"
    model = await two_steps(home)
    folder = home / "default" / "c" / "checkpoints"
    damage(folder / "2" / name, how)

    be = LocalBackend(device="cpu", home=str(home), http=False)
    with pytest.raises(CheckpointError) as e:
        async with art.session(model, backend=be):
            pass
    msg = str(e.value)
    assert f"checkpoint step 2 cannot be read: {folder / '2' / name}" in msg
    assert "the newest readable checkpoint is step 1" in msg and "resume=1" in msg
    assert (e.value.step, e.value.readable) == (2, 1)
    assert (folder / "2" / name).exists()  # nothing was moved or deleted by the failure

    async with art.session(model, backend=be, resume=1) as run:  # the offer, taken
        assert run.step == 1 and be.models["c"].step == 1
        prompt = be.models["c"].chat.prompt_ids(PROMPT)
        assert (await run.train(groups_for("c", prompt))).step == 2
    await be.close()
    (aside,) = (folder / "set-aside").iterdir()
    assert (aside / "2" / name).read_bytes() != (folder / "2" / name).read_bytes()  # kept, and a new step 2 made


async def test_nothing_readable_says_to_start_over(tmp_path, art_store):
    home = tmp_path / "home"
    model = await two_steps(home)
    folder = home / "default" / "c" / "checkpoints"
    for step in ("1", "2"):
        damage(folder / step / "adapter_model.safetensors", "truncate")
    be = LocalBackend(device="cpu", home=str(home), http=False)
    with pytest.raises(CheckpointError, match=r"step 2 cannot be read.*no earlier checkpoint can be read: start "
                                              r"over with art.session\(model, resume=False\)"):
        async with art.session(model, backend=be):
            pass
    with pytest.raises(CheckpointError, match="there is no checkpoint of step 7"):
        async with art.session(model, backend=be, resume=7):
            pass
    async with art.session(model, backend=be, resume=False) as run:
        assert run.step == 0
    await be.close()


async def test_serve_answers_a_damaged_checkpoint_with_a_400_that_names_it(tmp_path, art_store):
    home = tmp_path / "home"
    await two_steps(home, name="s", project="p")
    damage(home / "p" / "s" / "checkpoints" / "2" / "adapter_model.safetensors", "truncate")
    srv = Serve(home, free_port()).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            body = {"name": "s", "base_model": "tiny", "project": "p"}
            r = await c.post("/v1/art/models", json=body)
            assert r.status_code == 400, r.text  # a bare 500 before
            err = r.json()["error"]
            assert err["type"] == "CheckpointError" and "step 2" in err["message"]
            assert "adapter_model.safetensors" in err["message"] and "resume=1" in err["message"]
            r = await c.post("/v1/art/models", json={**body, "resume_step": 1})
            assert r.status_code == 200 and r.json()["step"] == 1
            assert (await c.get("/v1/art/models/s")).json()["step"] == 1
    finally:
        srv.stop()
    assert "Traceback" not in (home / "serve.log").read_text()
