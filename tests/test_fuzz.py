"""Property-based fuzzing of both HTTP APIs from their own OpenAPI specs (schemathesis):
whatever a client sends, the answer is never a 5xx. Bounded examples, loopback only:
the local backend's server in-process, `artsdk serve` as a subprocess, both with the tiny
model registered so valid names reach real generation and training code."""

import json
from collections import Counter

import anyio
import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

import artsdk as art  # noqa: E402
from backends.local import LocalBackend  # noqa: E402
from tests.serve_process import KEY, Serve, free_port  # noqa: E402

EXAMPLES = 40  # per operation and per mode (valid and invalid inputs)


def fuzz(schema, base_url: str, timeout: float) -> tuple[list[str], Counter]:
    """Call every operation of ``schema`` with generated requests: (the 5xx answers,
    described; how many answers of each status there were)."""
    from schemathesis import GenerationMode

    failures: list[str] = []
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      derandomize=True, database=None)
            @given(case=op.as_strategy(generation_mode=mode), aim=st.booleans())
            def call(case, aim):
                if aim:  # half the requests name the registered model, so they reach generation and training
                    if isinstance(case.body, dict) and "model" in case.body:
                        case.body["model"] = "m"
                        if isinstance(case.body.get("messages"), list):  # a conversation that renders
                            text = json.dumps(case.body["messages"])[:200]
                            case.body["messages"] = [{"role": "user", "content": text}]
                        for key, most in (("max_tokens", 8), ("max_completion_tokens", 8), ("n", 2),
                                          ("min_tokens", 8)):  # bounded, so the run stays short
                            if isinstance(case.body.get(key), int):
                                case.body[key] = min(case.body[key], most)
                        if case.body.get("max_tokens") is None:
                            case.body["max_tokens"] = 8
                    if case.path_parameters and "name" in case.path_parameters:
                        case.path_parameters["name"] = "m"
                r = case.call(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=timeout)
                statuses[r.status_code] += 1
                if r.status_code >= 500:
                    failures.append(f"{op.label} {mode.value}: {r.status_code} for {case.body!r:.300}")

            try:
                call()
            except Unsatisfiable:  # no invalid request exists for an operation without inputs
                pass
    return failures, statuses


@pytest.fixture(scope="module")
def local_root(tmp_path_factory):
    be = LocalBackend(device="cpu", home=str(tmp_path_factory.mktemp("home")), api_key=KEY, docs=True)
    endpoint = anyio.run(be.register, art.TrainableModel("m", base_model="tiny"))
    yield endpoint.base_url.removesuffix("/v1")
    anyio.run(be.close)


def test_local_server_never_answers_5xx(local_root):
    schema = schemathesis.openapi.from_url(local_root + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/models"} <= set(schema.raw_schema["paths"])
    failures, statuses = fuzz(schema, local_root, timeout=120)
    assert failures == []
    assert statuses[200] > 10 and sum(statuses.values()) > 80, statuses  # valid and invalid requests went through


def test_artsdk_serve_never_answers_5xx(tmp_path):
    s = Serve(tmp_path, free_port()).start()
    h = {"Authorization": f"Bearer {KEY}"}
    try:
        httpx.post(s.url + "/v1/art/models", headers=h, json={"name": "m", "base_model": "tiny"},
                   timeout=120).raise_for_status()
        schema = schemathesis.openapi.from_url(s.url + "/openapi.json", headers=h)
        failures, statuses = fuzz(schema, s.url, timeout=120)
        assert failures == []
        assert statuses[200] > 10 and sum(statuses.values()) > 300, statuses
    finally:
        s.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]  # nothing blew up inside, even where the answer was a 4xx


# -- any text, lone surrogates and control characters included ----------------------------

# half of them with a lone surrogate or a control character put in somewhere
ANY_TEXT = st.builds(lambda s, odd, at: s[:at] + odd + s[at:] if odd else s,
                     st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40),
                     st.one_of(st.just(""), st.characters(categories=["Cs", "Cc"])), st.integers(0, 40))


def test_any_text_in_any_field_of_the_inference_routes_is_never_a_5xx(local_root):
    """Strings of every category (lone surrogates sent as "\\udXXX" escapes, control
    characters) in the message content, names, tools, the Responses input and the Messages
    API's blocks."""
    statuses: Counter = Counter()
    with httpx.Client(base_url=local_root, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        @given(content=ANY_TEXT, name=ANY_TEXT, tool=ANY_TEXT, stream=st.booleans())
        def call(content, name, tool, stream):
            chat = {"model": "m", "max_tokens": 4, "stream": stream,
                    "messages": [{"role": "system", "content": name}, {"role": "user", "content": content, "name": name}],
                    "tools": [{"type": "function", "function": {"name": tool, "parameters": {}}}]}
            responses = {"model": "m", "max_output_tokens": 4, "stream": stream, "instructions": name,
                         "input": [{"role": "user", "content": content}]}
            messages = {"model": "m", "max_tokens": 4, "stream": stream, "system": name, "tools": [
                {"name": tool, "input_schema": {"type": "object"}}], "messages": [
                {"role": "user", "content": [{"type": "text", "text": content}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": name, "name": tool, "input": {"q": content}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": name, "content": [
                    {"type": "text", "text": content}, content]}]}]}
            for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses),
                               ("/v1/messages", messages)):
                r = c.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
                statuses[r.status_code] += 1
                assert r.status_code < 500, (path, r.status_code, r.text[:300])

        call()
    assert statuses[200] and statuses[400]  # both kinds were exercised


def test_any_text_anywhere_in_a_trajectory_is_stored(tmp_path):
    from artsdk.store.storable import escape

    with art.Store(tmp_path / "s.db") as store:
        @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        @given(name=ANY_TEXT, content=ANY_TEXT, outcome=ANY_TEXT, error=ANY_TEXT)
        def save(name, content, outcome, error):
            call = art.LLMCall(model=name, messages=[{"role": "user", "content": content}],
                               choices=[art.Choice(message={"role": "assistant", "content": outcome})])
            t = art.Trajectory(rollout=name, calls=[call], outcome={"text": outcome},
                               error=art.ErrorInfo(type="E", message=error))
            store.save(t)
            back = store.get(t.id)  # stored, every string as it was or escaped, never lost
            assert back.rollout == escape(name) and back.outcome == {"text": escape(outcome)}
            assert back.calls[0].messages[0]["content"] == escape(content) and back.error.message == escape(error)

        save()
