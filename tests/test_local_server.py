"""The local backend's OpenAI-compatible server, with the tiny model, over real HTTP."""

import json
import threading

import httpx
import pytest
from openai import BadRequestError, OpenAI

import artsdk as art
from tests.conftest import ENGINES

pytest.importorskip("torch")
from backends.local import LocalBackend  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object",
                                                                              "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture(scope="module", params=ENGINES)
def backend(request, tmp_path_factory):
    import anyio

    home = tmp_path_factory.mktemp("home")
    be = LocalBackend(device="cpu", home=str(home), api_key="sekret", engine=request.param)
    model = art.TrainableModel("tiny-agent", base_model="tiny", project="t")
    endpoint = anyio.run(be.register, model)
    yield be, endpoint
    anyio.run(be.close)


@pytest.fixture
def client(backend):
    _, endpoint = backend
    return OpenAI(base_url=endpoint.base_url, api_key="sekret", max_retries=0)


def user(text):
    return [{"role": "user", "content": text}]


def test_answer_carries_exact_tokens_and_step(client, backend):
    be, _ = backend
    served = be.models["tiny-agent"]
    r = client.chat.completions.create(model="tiny-agent", messages=user("hello"), max_tokens=12, seed=3)
    assert r.model == "tiny-agent@0"
    ch = r.choices[0]
    ids = ch.model_extra["token_ids"]
    assert 1 <= len(ids) <= 12 and len(ch.logprobs.content) == len(ids)
    assert all(lp.logprob <= 0 for lp in ch.logprobs.content)
    text = served.tokenizer.decode([t for t in ids if t not in served.chat.stop_ids])
    assert ch.message.content == text
    assert r.model_extra["prompt_token_ids"] == served.chat.prompt_ids(user("hello"))
    assert r.usage.completion_tokens == len(ids)
    # the same seed samples the same tokens
    again = client.chat.completions.create(model="tiny-agent", messages=user("hello"), max_tokens=12, seed=3)
    assert again.choices[0].model_extra["token_ids"] == ids


def test_min_tokens_holds_back_stop_tokens(client, backend):
    be, _ = backend
    engine = be.models["tiny-agent"].engine
    greedy = client.chat.completions.create(model="tiny-agent", messages=user("hi"), max_tokens=4, temperature=0)
    first = greedy.choices[0].model_extra["token_ids"][0]
    saved = set(engine.stop_ids)
    engine.stop_ids = saved | {first}  # make the greedy first token a stop token
    try:
        stopped = client.chat.completions.create(model="tiny-agent", messages=user("hi"), max_tokens=4,
                                                 temperature=0)
        assert stopped.choices[0].model_extra["token_ids"] == [first]
        assert stopped.choices[0].finish_reason == "stop"
        held = client.chat.completions.create(model="tiny-agent", messages=user("hi"), max_tokens=4,
                                              temperature=0, extra_body={"min_tokens": 3})
        ids = held.choices[0].model_extra["token_ids"]
        assert len(ids) >= 3 and first not in ids[:3]
    finally:
        engine.stop_ids = saved


def test_shared_prompts_are_run_once_and_answer_the_same(client, backend):
    from backends.local.engine import Request

    be, _ = backend
    served = be.models["tiny-agent"]
    one = client.chat.completions.create(model="tiny-agent", messages=user("share"), max_tokens=8, temperature=0)
    many = client.chat.completions.create(model="tiny-agent", messages=user("share"), max_tokens=8,
                                          temperature=0, n=3)
    expected = one.choices[0].model_extra["token_ids"]
    assert [c.model_extra["token_ids"] for c in many.choices] == [expected] * 3
    # a batch mixing a shared prompt with another one: each still gets its own answer
    p1, p2 = served.chat.prompt_ids(user("share")), served.chat.prompt_ids(user("a much longer other prompt"))
    futures = [served.engine.submit(Request(prompt=p, max_tokens=8, temperature=0)) for p in (p1, p2, p1)]
    alone = served.engine.submit(Request(prompt=p2, max_tokens=8, temperature=0)).result(60)[0].token_ids
    outs = [f.result(60)[0].token_ids for f in futures]
    assert outs == [expected, alone, expected]


def test_stream_n_and_stop(client):
    chunks = list(client.chat.completions.create(model="tiny-agent", messages=user("stream"), max_tokens=10,
                                                 stream=True, seed=1, n=2,
                                                 stream_options={"include_usage": True}))
    text = {0: "", 1: ""}
    ids = {0: [], 1: []}
    finish = {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
            ids[ch.index] += (ch.model_extra or {}).get("token_ids") or []
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert set(finish) == {0, 1} and chunks[-1].usage.completion_tokens == len(ids[0]) + len(ids[1])
    plain = client.chat.completions.create(model="tiny-agent", messages=user("stream"), max_tokens=10,
                                           seed=1, n=2)
    for i in (0, 1):
        assert plain.choices[i].model_extra["token_ids"] == ids[i]
        assert plain.choices[i].message.content == text[i]
    # a stop string cuts the text
    first = plain.choices[0].message.content
    assert len(first) > 3  # seeded: the same answer every run
    cut = client.chat.completions.create(model="tiny-agent", messages=user("stream"), max_tokens=10,
                                         seed=1, stop=[first[2:4]])
    assert cut.choices[0].message.content == first[:first.index(first[2:4])]
    assert cut.choices[0].finish_reason == "stop"


def test_responses_api_is_token_exact_streamed_or_not(client, backend):
    be, _ = backend
    served = be.models["tiny-agent"]
    r = client.responses.create(model="tiny-agent", input="hello", max_output_tokens=8, extra_body={"seed": 5})
    ids = r.model_extra["token_ids"]
    assert r.model == "tiny-agent@0" and 1 <= len(ids) <= 8 and len(r.model_extra["logprobs"]) == len(ids)
    assert r.output_text == served.tokenizer.decode([t for t in ids if t not in served.chat.stop_ids])
    events = list(client.responses.create(model="tiny-agent", input="hello", max_output_tokens=8, stream=True,
                                          extra_body={"seed": 5}))
    assert events[-1].type == "response.completed"
    assert events[-1].response.model_extra["token_ids"] == ids
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text


def test_tool_calls_parsed_and_malformed_kept_as_content(backend):
    be, _ = backend
    chat = be.models["tiny-agent"].chat
    content, calls = chat.parse('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', TOOLS)
    assert content is None and calls[0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}
    for bad in ('<tool_call>{"name": "search", "arguments": </tool_call>',
                '<tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>'):
        assert chat.parse(bad, TOOLS) == (bad, None)
    # tools render into the prompt, and a tool-calling conversation is accepted
    msgs = [{"role": "user", "content": "find"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "a"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "found a"}]
    prompt = be.models["tiny-agent"].tokenizer.decode(chat.prompt_ids(msgs, TOOLS))
    assert '"name": "search"' in prompt and "<tool_response>\nfound a" in prompt


def test_models_list_and_errors(client, backend):
    _, endpoint = backend
    ids = [m.id for m in client.models.list().data]
    assert "tiny-agent" in ids and "tiny-agent@0" in ids
    with pytest.raises(BadRequestError, match="unknown model 'nope'"):
        client.chat.completions.create(model="nope", messages=user("x"))
    with pytest.raises(BadRequestError, match="step 7 is not being served"):
        client.chat.completions.create(model="tiny-agent@7", messages=user("x"))
    with pytest.raises(BadRequestError, match="longer than the model's context"):
        client.chat.completions.create(model="tiny-agent", messages=user("word " * 3000))
    with pytest.raises(BadRequestError, match=r"messages.0.role: Input should be 'system'"):
        client.chat.completions.create(model="tiny-agent", messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny-agent", messages="not a list")  # type: ignore[arg-type]
    url = endpoint.base_url + "/chat/completions"
    r = httpx.post(url, json={"model": "tiny-agent", "messages": user("x")})
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    r = httpx.post(url, content=b"x" * (17 * 1024 * 1024), headers={"Authorization": "Bearer sekret",
                                                                   "content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(endpoint.base_url.replace("/v1", "/health")).status_code == 200


def test_concurrent_requests_share_batches(client, backend):
    be, _ = backend
    if be.engine != "builtin":
        pytest.skip("how the built-in engine batches (vLLM batches by itself)")
    engine = be.models["tiny-agent"].engine
    before = dict(engine.stats)
    results = []

    def one(i):
        r = client.chat.completions.create(model="tiny-agent", messages=user(f"q{i}"), max_tokens=8)
        results.append(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 16
    batches = engine.stats["batches"] - before["batches"]
    assert engine.stats["sequences"] - before["sequences"] == 16
    assert batches < 16  # shared forward passes, not one request after another
    json.dumps([r.model_dump() for r in results])
