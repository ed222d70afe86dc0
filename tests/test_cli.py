"""The `artsdk` command, run as a real subprocess against a real store file."""

import json
import subprocess
import sys

import pytest

import artsdk as art
from artsdk.testing import trajectory


def run(*args, cwd):
    out = subprocess.run([sys.executable, "-m", "artsdk.cli", *args], capture_output=True,
                         text=True, timeout=120, cwd=cwd)
    return out.returncode, out.stdout, out.stderr


@pytest.fixture
def filled(tmp_path):
    store = art.Store(tmp_path / "cli.db")
    good = trajectory([{"role": "user", "content": "hello there"},
                       {"role": "assistant", "content": "general kenobi"}],
                      project="demo", model="m", step=1, rewards={"win": 0.75}, rollout="duel",
                      outcome={"won": True})
    bad = trajectory([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                     project="demo", error="it broke", rollout="duel")
    store.save([good, bad])
    store.close()
    return tmp_path / "cli.db", good, bad


def test_list_show_export(filled, tmp_path):
    path, good, bad = filled
    code, out, _ = run("trajectories", "list", "--store", str(path), cwd=tmp_path)
    assert code == 0 and good.id[:10] in out and bad.id[:10] in out and "2 of 2 shown" in out
    assert "0.750" in out and "error: Exception" in out
    code, out, _ = run("trajectories", "list", "--store", str(path), "--errors", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [bad.id]
    code, out, _ = run("trajectories", "show", good.id[:8], "--store", str(path), cwd=tmp_path)
    assert code == 0 and "general kenobi" in out and "reward win = 0.7500" in out and '"won": true' in out
    code, _, err = run("trajectories", "export", str(tmp_path / "e.jsonl"), "--store", str(path),
                       "--min-reward", "0.5", cwd=tmp_path)
    assert code == 0 and "wrote 1 trajectories" in err
    assert json.loads((tmp_path / "e.jsonl").read_text())["id"] == good.id


def test_errors_are_one_clear_line(filled, tmp_path):
    path, _, _ = filled
    code, _, err = run("trajectories", "show", "ffffffffff", "--store", str(path), cwd=tmp_path)
    assert code == 2 and err.startswith("artsdk: StoreError: no trajectory 'ffffffffff'")
    (tmp_path / "junk.db").write_bytes(b"junk" * 100)
    code, _, err = run("trajectories", "list", "--store", str(tmp_path / "junk.db"), cwd=tmp_path)
    assert code == 2 and "corrupt" in err and "Traceback" not in err


def test_config_command_hides_the_key(tmp_path):
    (tmp_path / "artsdk.toml").write_text('project = "p"\napi_key = "secret"\n')
    code, out, _ = run("config", cwd=tmp_path)
    data = json.loads(out)
    assert code == 0 and data["project"] == "p" and data["api_key"] == "***"


def test_train_runs_an_example_folder(tmp_path):
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "ARTSDK_HOME": str(tmp_path / "home"), "ARTSDK_BACKEND_OPTIONS": '{"device": "cpu"}'}
    out = subprocess.run([sys.executable, "-m", "artsdk.cli", "train", "examples/temporal_clue", "--steps", "1",
                          "--base-model", "tiny", "--eval-games", "1", "--scenarios-per-step", "1",
                          "--group-size", "2"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the example warms up first (step 1, supervised), then takes its one GRPO step
    assert "step 1 (warm-up)" in out.stdout and "step 2: reward" in out.stdout, out.stdout[-2000:]
    assert "eval after 2 steps" in out.stdout
    code, _, err = run("train", "nowhere", cwd=tmp_path)
    assert code == 2 and "has no train.py" in err


def test_export_to_standard_output_says_so(filled, tmp_path):
    path, good, bad = filled
    code, out, err = run("trajectories", "export", "-", "--store", str(path), cwd=tmp_path)
    assert code == 0 and len(out.splitlines()) == 2 and {json.loads(x)["id"] for x in out.splitlines()} == {good.id, bad.id}
    assert err.strip() == "wrote 2 trajectories to standard output"


def test_a_store_that_cannot_be_written_is_not_called_corrupt(tmp_path):
    import os

    if os.access("/sys", os.W_OK) and not os.path.ismount("/sys"):
        pytest.skip("needs a folder this user cannot write to")
    with pytest.raises(art.StoreError) as e:
        art.Store("/sys/store.db")
    assert "corrupt" not in str(e.value) and "written" in str(e.value)


def test_a_missing_base_model_folder_is_not_a_hub_id(tmp_path):
    import anyio

    pytest.importorskip("torch")
    from backends.local import LocalBackend

    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    with pytest.raises(art.ModelLoadError, match="'./no/such/folder': there is no such folder or file"):
        anyio.run(be.register, art.TrainableModel("m", base_model="./no/such/folder"))
    anyio.run(be.close)
