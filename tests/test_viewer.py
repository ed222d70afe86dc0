"""`artsdk view` and the trackers, against a store filled by a real short run on the tiny
model: the JSON API, the metrics in TensorBoard, W&B (offline) and MLflow, and the page
itself driven by headless Chromium (from the system packages), all on 127.0.0.1.
Screenshots of each view land in $ARTSDK_TEST_ARTIFACTS (default .artifacts/)."""

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

import artsdk as art

pytest.importorskip("torch")
pytest.importorskip("fastapi")
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("ARTSDK_TEST_ARTIFACTS", ROOT / ".artifacts")) / "viewer"
STEPS = 3


def tool_agent(client, name="viewer"):
    """The tiny model answers; the agent then runs its search tool and asks again with the
    result (a tool call and its result in the conversation, as agents do)."""
    @art.rollout
    async def researcher(q: int) -> str:
        messages = [{"role": "user", "content": f"find item {q}"}]
        first = await client.chat.completions.create(model=name, messages=messages, max_tokens=6)
        call = {"id": f"call_{q}", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": q})}}
        messages += [{"role": "assistant", "content": first.choices[0].message.content, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{q}", "content": f"item {q} is on shelf {q % 3}"}]
        second = await client.chat.completions.create(model=name, messages=messages, max_tokens=6)
        return second.choices[0].message.content or ""

    return researcher


@art.reward
def first_token(t: art.Trajectory) -> float:
    return t.calls[-1].choices[0].token_ids[0] / 1000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real run: 3 GRPO steps on the tiny model, with every tracker on; its store."""
    import anyio
    from openai import AsyncOpenAI

    from backends.local import LocalBackend

    home = tmp_path_factory.mktemp("viewer")

    async def go():
        art.configure(home=str(home), store=str(home / "store.db"), trackers=["tensorboard", "wandb", "mlflow"],
                      tracker_options={"wandb": {"mode": "offline"}}, progress=False)
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
        agent = tool_agent(client)
        be = LocalBackend(device="cpu")
        async with art.session(art.TrainableModel("viewer", base_model="tiny", project="lab"), backend=be) as session:
            for _ in range(STEPS):
                groups = await art.gather(agent, range(3), group_size=3, rewards=[first_token])
                assert (await session.train(groups)).trained
            await art.gather(agent, range(3), group_size=3, rewards=[first_token])  # at the last step too
        await be.close()
        await client.close()
        art.configure(trackers=None, tracker_options=None)

    os.environ["WANDB_SILENT"] = "true"
    anyio.run(go)
    yield home
    art.configure(home=None, store=None, progress=None)


@pytest.fixture(scope="module")
def viewer(run):
    import uvicorn

    from artsdk.viewer.app import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(art.Store(str(run / "store.db"))), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


# -- the JSON API -------------------------------------------------------------------------

def test_api_projects_curve_groups_trajectories_compare(viewer):
    api = httpx.Client(base_url=viewer + "/api")
    (lab,) = [p for p in api.get("/projects").json() if p["project"] == "lab"]
    assert lab["models"] == [{"model": "viewer", "trajectories": 9 * (STEPS + 1), "last_step": STEPS, "runs": 1,
                              "base_model": "tiny"}]
    curve = api.get("/curve", params={"project": "lab", "model": "viewer"}).json()
    assert [p["step"] for p in curve["points"]] == list(range(STEPS + 1)) and all(p["n"] == 9 for p in curve["points"])
    assert [m["step"] for m in curve["metrics"]] == list(range(1, STEPS + 1))
    assert {"loss", "clip_fraction", "kl", "tokens_trained", "seconds"} <= set(curve["metrics"][0])
    groups = api.get("/groups", params={"project": "lab", "model": "viewer", "step": 1}).json()
    assert groups["total"] == 3 and all(len(g["trajectories"]) == 3 for g in groups["groups"])
    assert all("first_token" in t["rewards"] for g in groups["groups"] for t in g["trajectories"])
    page = api.get("/trajectories", params={"project": "lab", "min_step": 2, "limit": 4}).json()
    assert page["total"] == 18 and len(page["rows"]) == 4 and all(r["step"] >= 2 for r in page["rows"])
    best = max(r["reward"] for r in api.get("/trajectories", params={"project": "lab", "limit": 100}).json()["rows"])
    assert api.get("/trajectories", params={"min_reward": best}).json()["total"] >= 1
    assert api.get("/trajectories", params={"project": "lab", "errors": True}).json()["total"] == 0
    one = api.get("/trajectories/" + page["rows"][0]["id"]).json()
    choice = one["calls"][1]["choices"][0]
    assert len(choice["token_texts"]) == len(choice["token_ids"])  # the tiny model's tokenizer, found in the cache
    assert one["calls"][1]["messages"][1]["tool_calls"][0]["function"]["name"] == "search"
    scenario = json.dumps(one["scenario"])
    both = api.get("/compare", params={"project": "lab", "model": "viewer", "scenario": scenario, "a": 0, "b": STEPS}).json()
    assert len(both["a"]) == 3 and len(both["b"]) == 3 and {t["step"] for t in both["b"]} == {STEPS}
    assert api.get("/trajectories/nope-not-there").status_code == 404


def test_a_key_is_required_when_configured(run):
    from fastapi.testclient import TestClient

    from artsdk.viewer.app import build_app

    client = TestClient(build_app(art.Store(str(run / "store.db")), api_key="s3cret"))
    assert client.get("/api/projects").status_code == 401
    assert client.get("/api/projects", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    r = client.get("/?key=s3cret", follow_redirects=False)
    assert r.status_code == 303 and "key=" not in r.headers["location"]
    assert client.get("/api/projects").status_code == 200  # the cookie it set


# -- trackers -----------------------------------------------------------------------------

def test_metrics_reached_tensorboard_wandb_and_mlflow(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard" / "lab" / "viewer"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == list(range(1, STEPS + 1))
    assert {"reward_mean", "clip_fraction", "tokens_trained"} <= set(events.Tags()["scalars"])

    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "lab"]
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_name == "viewer" and mlrun.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(mlrun.info.run_id, "loss")] == list(range(1, STEPS + 1))

    (offline,) = list((run / "wandb").glob("offline-run-*"))
    (history,) = list(offline.glob("*.wandb"))
    from wandb.proto import wandb_internal_pb2

    logged = []
    for data in wandb_records(history):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            if "loss" in items:
                logged.append(int(items["_step"]))
    assert logged == list(range(1, STEPS + 1))


def wandb_records(path):
    """The records of an offline W&B run file (the LevelDB log format W&B writes: a 7-byte
    file header, then 32 KiB blocks of records with a 7-byte header each)."""
    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind == 1:  # a whole record
            yield chunk
        elif kind == 2:  # first, middle, last pieces of one that spans blocks
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


# -- the page in a real browser ------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("needs Chromium and ChromeDriver from the system packages (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def wait_for(driver, css, count=None, timeout=15):
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if found and (count is None or len(found) == count):
            return found
        time.sleep(0.1)
    raise AssertionError(f"{css}: found {len(driver.find_elements(By.CSS_SELECTOR, css))}, wanted {count or 'some'}")


def test_the_page_shows_curve_groups_chat_compare_and_filters(viewer, browser):
    from selenium.webdriver.common.by import By

    browser.get(viewer + "/")
    wait_for(browser, "#projects a")
    browser.save_screenshot(str(ARTIFACTS / "projects.png"))
    browser.find_element(By.LINK_TEXT, "viewer").click()
    points = wait_for(browser, "[data-chart=reward] g.main circle.pt", count=STEPS + 1)  # one point per step
    wait_for(browser, "[data-chart=loss] circle.pt", count=STEPS)
    browser.save_screenshot(str(ARTIFACTS / "curve.png"))
    points[1].click()  # step 1: its groups
    groups = wait_for(browser, "#groups tr.group", count=3)
    assert "step=1" in browser.current_url and len(groups[0].find_elements(By.CSS_SELECTOR, "a")) >= 3
    browser.save_screenshot(str(ARTIFACTS / "groups.png"))
    groups[0].find_element(By.PARTIAL_LINK_TEXT, "#").click()  # one trajectory as a chat
    wait_for(browser, ".msg.tool")
    text = browser.find_element(By.ID, "main").text
    assert "→ search(" in text and "shelf" in text  # its tool call and the tool's result
    assert browser.find_elements(By.CSS_SELECTOR, ".tokens .tok")  # sampled tokens, shaded by logprob
    browser.save_screenshot(str(ARTIFACTS / "trajectory.png"))
    browser.back()
    wait_for(browser, "#groups tr.group", count=3)[0].find_element(By.PARTIAL_LINK_TEXT, "compare").click()
    columns = wait_for(browser, "#compare .column", count=2)
    assert all(c.find_elements(By.CSS_SELECTOR, ".card") for c in columns)  # step 0 and step 1, side by side
    browser.save_screenshot(str(ARTIFACTS / "compare.png"))
    link = browser.current_url  # state in the address: the same view from a fresh load
    browser.get("about:blank")
    browser.get(link)
    assert len(wait_for(browser, "#compare .column", count=2)) == 2
    browser.get(viewer + "/#/trajectories?project=lab")
    everything = len(wait_for(browser, "#trajectories tr.traj"))
    field = browser.find_element(By.CSS_SELECTOR, "#filters input[name=min_step]")
    field.send_keys(str(STEPS))
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    filtered = wait_for(browser, "#trajectories tr.traj", count=9)
    assert len(filtered) < everything and f"min_step={STEPS}" in browser.current_url
    browser.save_screenshot(str(ARTIFACTS / "trajectories.png"))


# -- hostile input and exposure ------------------------------------------------------------

def odd_store(path):
    """A store holding trajectories of shapes other clients leave: a custom tool call without
    ``function``, content lists holding null, numbers and dicts, ``tool_calls`` that is not a list."""
    calls = [art.LLMCall(index=0, model="m", messages=[
        {"role": "user", "content": [None, 7, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "see"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "foo"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": {"lines": 3}},
        {"role": "assistant", "content": "x", "tool_calls": {"id": "c2", "function": {"name": "ls", "arguments": {"dir": "/"}}}},
    ], choices=[art.Choice(message={"role": "assistant", "content": [1, None, "done"], "tool_calls": "not a list"})])]
    t = art.Trajectory(rollout="odd", project="p", model="m", step=1, calls=calls, reward=1.0)
    with art.Store(path) as store:
        store.save(t)
    return t


def serve_viewer(store_path, hosts=None):
    import uvicorn

    from artsdk.viewer.app import allowed_hosts, build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(art.Store(str(store_path)), hosts=allowed_hosts("127.0.0.1", port) if hosts else None)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


def test_huge_numbers_and_a_non_json_scenario_are_400s(tmp_path):
    odd_store(tmp_path / "s.db")
    server, thread, url = serve_viewer(tmp_path / "s.db")
    try:
        big = str(2**63)
        for path, params in [("groups", {"project": "p", "model": "m", "step": big}),
                             ("groups", {"project": "p", "model": "m", "step": 1, "offset": big}),
                             ("trajectories", {"min_step": big}), ("trajectories", {"max_step": "-" + big + "0"}),
                             ("trajectories", {"offset": big}), ("scenarios", {"project": "p", "model": "m", "step": big}),
                             ("compare", {"project": "p", "model": "m", "scenario": "{}", "a": big, "b": 0}),
                             ("compare", {"project": "p", "model": "m", "scenario": "{}", "a": 0, "b": big}),
                             ("compare", {"project": "p", "model": "m", "scenario": "not json", "a": 0, "b": 1})]:
            r = httpx.get(f"{url}/api/{path}", params=params)
            assert 400 <= r.status_code < 500, (path, params, r.status_code, r.text)  # 500 OverflowError before
        assert "not JSON" in httpx.get(f"{url}/api/compare", params={"project": "p", "model": "m", "scenario": "x{",
                                                                       "a": 0, "b": 1}).text
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_request_for_another_host_is_refused(tmp_path):
    odd_store(tmp_path / "s.db")
    server, thread, url = serve_viewer(tmp_path / "s.db", hosts=True)
    port = url.rsplit(":", 1)[1]
    try:
        assert httpx.get(url + "/api/projects").status_code == 200
        assert httpx.get(f"http://localhost:{port}/api/projects").status_code == 200
        # a page on attacker.example that pointed its name at 127.0.0.1 (DNS rebinding)
        r = httpx.get(url + "/api/projects", headers={"host": f"attacker.example:{port}"})
        assert r.status_code == 421 and "attacker.example" in r.text
    finally:
        server.should_exit = True
        thread.join(10)


def test_artsdk_view_closes_a_connection_whose_headers_never_end(tmp_path):
    """`artsdk view` as users start it: a client that sends half its headers (or nothing) is cut
    off after the header deadline, and the viewer goes on answering others."""
    import subprocess
    import sys

    from artsdk.slow_clients import HEADER_TIMEOUT

    odd_store(tmp_path / "s.db")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "artsdk.cli", "view", "--store", str(tmp_path / "s.db"),
                             "--port", str(port)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/api/projects", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "artsdk view did not start"
                time.sleep(0.2)
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        slow[0].sendall(b"GET /api/projects HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        t0 = time.monotonic()
        for sock in slow:
            sock.settimeout(HEADER_TIMEOUT + 10)
            assert sock.recv(1024) == b""  # closed by the viewer (held open for good before)
            sock.close()
        assert time.monotonic() - t0 < HEADER_TIMEOUT + 5
        assert httpx.get(url + "/api/projects", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_view_refuses_a_missing_store_and_warns_on_an_open_bind(tmp_path, monkeypatch, capsys):
    import uvicorn

    from artsdk import cli

    missing = tmp_path / "typo.db"
    assert cli.main(["view", "--store", str(missing)]) == 2
    assert "there is no store at" in capsys.readouterr().err and not missing.exists()  # was made, empty
    odd_store(tmp_path / "s.db")
    ran = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.append(kw))  # no listening on every address in a test
    assert cli.main(["view", "--store", str(tmp_path / "s.db"), "--host", "0.0.0.0"]) == 0
    assert ran and ran[0]["host"] == "0.0.0.0" and "without a key" in capsys.readouterr().err
    assert cli.main(["view", "--store", str(tmp_path / "s.db"), "--host", "127.0.0.1"]) == 0
    assert "without a key" not in capsys.readouterr().err


def test_the_trajectory_page_shows_any_stored_shape(tmp_path, browser):
    from selenium.webdriver.common.by import By

    t = odd_store(tmp_path / "s.db")
    server, thread, url = serve_viewer(tmp_path / "s.db")
    try:
        browser.get(f"{url}/#/trajectory?id={t.id}")
        wait_for(browser, ".msg.tool")
        text = browser.find_element(By.ID, "main").text
        assert "error:" not in text  # TypeError: tc.function is undefined, before
        assert "see" in text and "7" in text and '{"lines":3}' in text
        assert '"custom":{"name":"grep","input":"foo"}' in text.replace(" ", "")  # shown raw
        assert 'ls({"dir":"/"})' in text and '"not a list"' in text
        browser.save_screenshot(str(ARTIFACTS / "odd_shapes.png"))
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_trajectory_page_says_what_each_record_held(tmp_path, browser):
    """A call only the backend's endpoint saw (a subprocess's, say) is marked as added from its
    record, and the two records' counts are on the page (artsdk/rollout/reconcile.py)."""
    from selenium.webdriver.common.by import By

    ask = [{"role": "user", "content": "hi"}]
    calls = [art.LLMCall(index=0, provider="openai", model="m", messages=ask,
                         choices=[art.Choice(message={"role": "assistant", "content": "from the client"})]),
             art.LLMCall(index=1, provider="endpoint", model="m", messages=ask,
                         choices=[art.Choice(message={"role": "assistant", "content": "from a subprocess"})])]
    t = art.Trajectory(rollout="r", project="p", model="m", step=1, calls=calls, reward=1.0,
                       metadata={"calls_recorded": {"client": 1, "endpoint": 2, "matched": 1,
                                                    "endpoint_only": 1, "client_only": 0}})
    with art.Store(tmp_path / "s.db") as store:
        store.save(t)
    server, thread, url = serve_viewer(tmp_path / "s.db")
    try:
        browser.get(f"{url}/#/trajectory?id={t.id}")
        wait_for(browser, ".recorded")
        counts = browser.find_element(By.CSS_SELECTOR, ".recorded")
        assert counts.text.startswith("calls recorded: by the client 1 · by the endpoint 2 · matched 1")
        assert [f.text for f in counts.find_elements(By.CSS_SELECTOR, ".flag")] == ["1 only the endpoint saw"]
        heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".callhead")]
        assert "from the endpoint" not in heads[0] and "from the endpoint" in heads[1]
        browser.save_screenshot(str(ARTIFACTS / "records.png"))
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_trajectory_page_links_the_rollouts_run_inside_it(tmp_path, browser):
    """A sub-agent's calls are on its own trajectory: the outer page names it, and its page
    names the outer one (artsdk/rollout/decorator.py)."""
    from selenium.webdriver.common.by import By

    ask = [{"role": "user", "content": "hi"}]
    call = art.LLMCall(index=0, provider="openai", model="m", messages=ask,
                       choices=[art.Choice(message={"role": "assistant", "content": "found it"})])
    outer = art.Trajectory(rollout="lead", project="p", model="m", step=1, reward=1.0)
    inner = art.Trajectory(rollout="researcher", project="p", model="m", step=1, calls=[call],
                           metadata={"parent": outer.id})
    outer.metadata["children"] = [inner.id]
    with art.Store(tmp_path / "s.db") as store:
        store.save([outer, inner])
    server, thread, url = serve_viewer(tmp_path / "s.db")
    try:
        browser.get(f"{url}/#/trajectory?id={outer.id}")
        wait_for(browser, ".related .children a")
        child = browser.find_element(By.CSS_SELECTOR, ".related .children a")
        assert child.text == inner.id[:10]
        child.click()
        wait_for(browser, ".related .parent a")
        assert browser.find_element(By.CSS_SELECTOR, ".related .parent a").text == outer.id[:10]
        assert "found it" in browser.find_element(By.CSS_SELECTOR, ".chat").text
        browser.save_screenshot(str(ARTIFACTS / "sub_rollouts.png"))
    finally:
        server.should_exit = True
        thread.join(10)


def two_runs_store(path):
    """One model, two runs of it: steps 1-2 each, their rewards apart (0.1.. and 0.9..)."""
    with art.Store(path) as store:
        for run, base in (("first", 0.1), ("second", 0.9)):
            store.record_run("p", "m", run, base_model="tiny")
            for step in (0, 1, 2):
                store.save([art.Trajectory(rollout="r", project="p", model="m", run=run, step=step,
                                           reward=base + step / 100 + k / 1000) for k in range(3)])
                if step:
                    store.record_step("p", "m", step, {"loss": base}, run=run)
    return path


def test_two_runs_of_a_model_are_told_apart(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    server, thread, url = serve_viewer(two_runs_store(tmp_path / "s.db"))
    try:
        data = httpx.get(url + "/api/curve", params={"project": "p", "model": "m"}).json()
        assert data["run"] == "second" and [r["run"] for r in data["runs"]] == ["second", "first"]
        assert [round(q["mean"], 2) for q in data["points"]] == [0.9, 0.91, 0.92]  # the newest run, alone
        assert [m["loss"] for m in data["metrics"]] == [0.9, 0.9]
        first = httpx.get(url + "/api/curve", params={"project": "p", "model": "m", "run": "first"}).json()
        assert [round(q["mean"], 2) for q in first["points"]] == [0.1, 0.11, 0.12]  # was 0.5: two runs averaged
        assert httpx.get(url + "/api/trajectories", params={"run": "first"}).json()["total"] == 9
        assert httpx.get(url + "/api/projects").json()[0]["models"][0]["runs"] == 2
        browser.get(f"{url}/#/model?project=p&model=m")
        wait_for(browser, "[data-chart=reward] g.main circle.pt", count=3)
        menu = Select(browser.find_element(By.ID, "run"))
        assert [o.get_attribute("value") for o in menu.options] == ["second", "first"]
        menu.select_by_value("first")
        for _ in range(100):
            if "run=first" in browser.current_url:
                break
            time.sleep(0.05)
        assert "run=first" in browser.current_url
        wait_for(browser, "#steps tr", count=4)
        assert "0.110" in browser.find_element(By.ID, "steps").text  # the first run's rewards
        flat = browser.find_element(By.CSS_SELECTOR, "[data-chart=loss].flat")  # a line with no scale before
        assert "0.100 at every step" in flat.text and not flat.find_elements(By.TAG_NAME, "svg")
        browser.save_screenshot(str(ARTIFACTS / "runs.png"))
    finally:
        server.should_exit = True
        thread.join(10)


# -- what was learned: evaluations, reward parts, the warm-up, batches that trained nothing --

@art.reward
def brevity(t: art.Trajectory) -> float:
    return 1.0 / (1 + len(t.outcome or ""))


@art.reward
def tied(t: art.Trajectory) -> float:
    return 0.5


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A real run on the tiny model: an evaluation at step 0, a warm-up, an evaluation, two
    GRPO steps on a reward of two named parts each followed by an evaluation, then a batch in
    which every group ties (nothing to learn from); its store."""
    import anyio
    from openai import AsyncOpenAI

    from backends.local import LocalBackend

    home = tmp_path_factory.mktemp("learned")
    conversation = {"messages": [{"role": "user", "content": "find item 1"}, {"role": "assistant", "content": "shelf 1"}]}

    async def go():
        art.configure(home=str(home), store=str(home / "store.db"), progress=False)
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
        agent = tool_agent(client, "learner")
        be = LocalBackend(device="cpu")
        async with art.session(art.TrainableModel("learner", base_model="tiny", project="lab"), backend=be) as run:
            evaluations = [await run.evaluate(agent, range(10, 14), rewards=[first_token, brevity], name="held-out")]
            await run.train_sft([conversation] * 2, epochs=1)
            evaluations.append(await run.evaluate(agent, range(10, 14), rewards=[first_token, brevity], name="held-out"))
            for _ in range(2):
                groups = await art.gather(agent, range(3), group_size=3, rewards=[first_token, brevity])
                assert (await run.train(groups)).trained
                evaluations.append(await run.evaluate(agent, range(10, 14), rewards=[first_token, brevity],
                                                      name="held-out"))
            flat = await art.gather(agent, range(2), group_size=2, rewards=[tied])
            assert not (await run.train(flat)).trained
        await be.close()
        await client.close()
        return evaluations

    evaluations = anyio.run(go)
    yield home, evaluations
    art.configure(home=None, store=None, progress=None)


def test_the_api_files_evaluations_parts_warmup_and_untrained_batches(learned):
    home, evaluations = learned
    assert [e.step for e in evaluations] == [0, 1, 2, 3] and all(e.scenarios == 4 for e in evaluations)
    server, thread, url = serve_viewer(home / "store.db")
    try:
        data = httpx.get(url + "/api/curve", params={"project": "lab", "model": "learner"}).json()
        # the training groups alone: no point at step 0 (only evaluated there), 9 + 9 + 4 rollouts
        assert [(q["step"], q["n"]) for q in data["points"]] == [(1, 9), (2, 9), (3, 4)]
        assert {q["name"] for q in data["parts"]} == {"first_token", "brevity", "tied"}
        by_step = {m["step"]: m for m in data["metrics"]}
        assert [by_step[s]["eval/held-out/reward"] for s in range(4)] == pytest.approx([e.reward for e in evaluations])
        assert by_step[2]["eval/held-out/part/brevity"] == pytest.approx(evaluations[2].parts["brevity"])
        assert by_step[1]["sft"] == 1.0 and "loss" in by_step[1] and "sft" not in by_step[2]
        assert by_step[3]["untrained_batches"] == 1 and "equal rewards" in by_step[3]["untrained_reason"]
        assert "loss" in by_step[3]  # the step's own training figures kept beside them
        groups = httpx.get(url + "/api/groups", params={"project": "lab", "model": "learner", "step": 2}).json()
        assert groups["total"] == 3  # the step's evaluation is not a group
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_model_page_shows_what_was_learned(learned, browser):
    from selenium.webdriver.common.by import By

    home, evaluations = learned
    server, thread, url = serve_viewer(home / "store.db")
    try:
        browser.get(f"{url}/#/model?project=lab&model=learner")
        wait_for(browser, "[data-chart=eval-held-out] g.main circle.pt", count=4)  # steps 0-3
        assert "4 scenarios" in browser.find_element(By.CSS_SELECTOR, "[data-chart=eval-held-out] h3").text
        chart = browser.find_element(By.CSS_SELECTOR, "[data-chart=reward]")
        legend = [label.text for label in chart.find_elements(By.CSS_SELECTOR, ".legend label")]
        assert legend[0] == "total" and {"first_token", "brevity"} <= set(legend)
        part = chart.find_element(By.CSS_SELECTOR, 'g.series[data-line="brevity"]')
        assert not part.is_displayed()  # the total by default
        chart.find_element(By.CSS_SELECTOR, '.legend label[data-line="brevity"] input').click()
        assert part.is_displayed() and len(part.find_elements(By.CSS_SELECTOR, "circle.pt")) == 2  # steps 1 and 2
        assert chart.find_elements(By.CSS_SELECTOR, 'rect.warmup[data-step="1"]')  # the warm-up, marked
        sft_loss = browser.find_element(By.CSS_SELECTOR, "[data-chart=sft_loss]").text  # its loss apart
        assert "warm-up" in sft_loss and "at step 1" in sft_loss
        wait_for(browser, "[data-chart=loss] g.main circle.pt", count=2)  # the GRPO steps' loss
        untrained = browser.find_element(By.ID, "untrained").text
        assert "equal rewards" in untrained and "3" in untrained
        steps = {row.find_element(By.TAG_NAME, "td").text: row.text for row in browser.find_elements(By.CSS_SELECTOR, "#steps tr")[1:]}
        assert "warm-up" in steps["1"] and "trained nothing" in steps["3"] and "warm-up" not in steps["2"]
        browser.save_screenshot(str(ARTIFACTS / "learned.png"))
        time.sleep(5.5)  # the page redraws while a run goes on: a line the reader showed stays shown
        assert browser.find_element(By.CSS_SELECTOR, '[data-chart=reward] g.series[data-line="brevity"]').is_displayed()
    finally:
        server.should_exit = True
        thread.join(10)
