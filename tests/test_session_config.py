"""Settings precedence, and art.session routing calls to a backend's endpoint."""

import pytest
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing.mock_server import MockServer

pytestmark = pytest.mark.anyio


def test_settings_precedence(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.artsdk]\nproject = "from-pyproject"\n')
    assert art.configure().project == "from-pyproject"
    (tmp_path / "artsdk.toml").write_text('project = "from-file"\nconcurrency = 8\nhome = "runs"\n'
                                          '[backend_options]\ndevice = "cpu"\n')
    s = art.configure()
    assert (s.project, s.concurrency, s.backend_options) == ("from-file", 8, {"device": "cpu"})
    assert s.home == str(tmp_path / "runs") and s.store_url == f"sqlite:///{tmp_path}/runs/store.db"
    monkeypatch.setenv("ARTSDK_PROJECT", "from-env")
    monkeypatch.setenv("ARTSDK_CONCURRENCY", "4")
    s = art.configure()
    assert (s.project, s.concurrency) == ("from-env", 4)
    assert art.configure(project="from-code").project == "from-code"
    assert art.configure(project=None).project == "from-env"


def test_settings_found_in_a_parent_folder(tmp_path, monkeypatch):
    (tmp_path / "artsdk.toml").write_text('backend = "remote"\n')
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    s = art.configure()
    assert s.backend == "remote" and s.config_file == str(tmp_path / "artsdk.toml")


def test_bad_settings_name_the_culprit(tmp_path, monkeypatch):
    (tmp_path / "artsdk.toml").write_text('projet = "typo"\n')
    with pytest.raises(art.ConfigError, match=r"unknown setting\(s\) \['projet'\] in .*artsdk.toml"):
        art.configure()
    (tmp_path / "artsdk.toml").write_text('concurrency = "lots"\n')
    with pytest.raises(art.ConfigError, match="setting 'concurrency' is invalid.*'lots'"):
        art.configure()
    (tmp_path / "artsdk.toml").write_text('concurrency = [\n')
    with pytest.raises(art.ConfigError, match="is not valid TOML"):
        art.configure()
    (tmp_path / "artsdk.toml").unlink()
    monkeypatch.setenv("ARTSDK_BACKEND_OPTIONS", "{not json")
    with pytest.raises(art.ConfigError, match="ARTSDK_BACKEND_OPTIONS must be a JSON object"):
        art.configure()
    monkeypatch.delenv("ARTSDK_BACKEND_OPTIONS")
    with pytest.raises(art.ConfigError, match="unknown setting"):
        art.configure(colour="blue")


def test_unknown_backend_is_a_clear_error():
    art.configure(backend="warp-drive")
    with pytest.raises(art.BackendError, match="no backend named 'warp-drive'.*ARTSDK_BACKEND"):
        art.load_backend()


class ScriptedBackend:
    """A Backend whose 'training' bumps the step its own inference server reports.

    The local backend (a real model) is tested in its own suite; this one checks the
    session plumbing: registration, routing, steps and what gets recorded.
    """

    def __init__(self, server):
        self.server = server
        self.trained = []
        self.closed = False

    async def register(self, model):
        return art.Endpoint(base_url=self.server.base_url, api_key="backend-key", model=model.name)

    async def train(self, model, groups, **config):
        self.trained.append((groups, config))
        step = len(self.trained)
        self.server.set_step(step)
        silent = sum(g.no_signal for g in groups)
        return art.TrainResult(step=step, metrics={"loss": 0.5 / step}, checkpoint=f"ckpt/{step}",
                               groups_trained=len(groups) - silent, groups_skipped=silent)

    async def train_sft(self, model, trajectories, **config):
        return await self.train(model, [], **config)

    async def step(self, model):
        return len(self.trained)

    async def close(self):
        self.closed = True


async def test_session_routes_the_trainable_model_to_the_backend(server, art_store):
    agent_client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="user-key", max_retries=0)
    other_client = AsyncOpenAI(base_url=server.base_url, api_key="user-key")

    @art.rollout
    async def agent(q: str):
        r = await agent_client.chat.completions.create(model="ttt", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.reward
    def length(t):
        return float(len(t.outcome))

    with MockServer() as backend_server:
        backend = ScriptedBackend(backend_server)
        model = art.TrainableModel("ttt", base_model="tiny", project="games")
        assert isinstance(backend, art.Backend)
        async with art.session(model, backend=backend) as run:
            assert art.current_session() is run and run.step == 0
            groups = await art.gather(agent, ["a", "bb"], group_size=2, rewards=[length])
            assert groups[0][0].outcome == "echo: a"  # answered although the client's URL is dead
            assert backend_server.requests[-1]["auth"] == "Bearer backend-key"
            result = await run.train(groups, learning_rate=1e-4)
            assert result.step == 1 == run.step and result.groups_skipped == 2
            assert backend.trained[0][1] == {"learning_rate": 1e-4}
            after = await agent.collect("ccc")
            # calls for other models still go where their client points
            r = await other_client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "x"}])
            assert r.model == "gpt@0"
            # name@step names one step of the trainable model: routed too, the step kept
            r = await agent_client.chat.completions.create(model="ttt@0", messages=[{"role": "user", "content": "y"}])
            assert backend_server.requests[-1]["body"]["model"] == "ttt@0"
            # a misspelt name is not routed: the failure says which name was meant
            with pytest.raises(Exception) as caught:
                await agent_client.chat.completions.create(model="ttt-", messages=[{"role": "user", "content": "z"}])
            assert any("'ttt-' is not the trainable model 'ttt'" in n for n in caught.value.__notes__)
        assert not backend.closed  # a backend passed in is the caller's to close
        assert art.current_session() is None and "ttt" not in art.capture.routes

    first = art_store.trajectories(group_id=groups[0].id)
    (run_id,) = {t.run for t in first}  # the session's run, on everything it gathered
    assert {(t.project, t.model, t.step) for t in first} == {("games", "ttt", 0)} and run_id
    assert after.step == 1 and after.calls[0].served_by == "ttt@1"
    assert art_store.steps("games", "ttt")[0]["metrics"] == {"loss": 0.5}
    assert art_store.checkpoints("games", "ttt") == [{"step": 1, "run": run_id, "path": "ckpt/1",
                                                      "metrics": {"loss": 0.5}}]
    with pytest.raises(art.RolloutError, match="got no groups"):
        async with art.session(model, backend=backend) as run:
            await run.train([])
    await agent_client.close()
    await other_client.close()


def test_every_setting_is_documented():
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    for name in art.Settings.model_fields:
        if name != "config_file":
            assert f"| `{name}` | `ARTSDK_{name.upper()}" in page, name


def test_misspelt_environment_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("ARTSDK_BACKNED", "remote")
    with pytest.raises(art.ConfigError, match="unknown environment variable ARTSDK_BACKNED"):
        art.configure(project="x")
    monkeypatch.delenv("ARTSDK_BACKNED")
    monkeypatch.setenv("ARTSDK_CACHE", "/tmp/somewhere")  # read by the local backend: not an error
    assert art.configure(project="x").project == "x"


def test_paths_in_the_config_file_are_relative_to_it(tmp_path, monkeypatch):
    (tmp_path / "artsdk.toml").write_text('store = "runs/store.db"\nhome = "state"\n')
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    s = art.configure(project="x")
    assert s.store == str(tmp_path / "runs" / "store.db") and s.home == str(tmp_path / "state")
    monkeypatch.setenv("ARTSDK_STORE", "mine.db")  # from the environment: as given
    assert art.configure(project="x").store == "mine.db"
