"""Each call on exactly one trajectory: a rollout run inside another keeps its calls on its own
trajectory and the outer one names it (``metadata["children"]`` / ``["parent"]``) instead of
copying them; a call whose client-side handling raised after the answer arrived is one call,
the client's record with the endpoint's answer in it, never the two side by side. Real servers
on 127.0.0.1: the mock server, and a session on the local backend with the tiny model."""

import httpx
import pytest
from openai import AsyncOpenAI, LengthFinishReasonError
from pydantic import BaseModel

import artsdk as art
from artsdk.rollout.reconcile import MISMATCH

pytestmark = pytest.mark.anyio


def said(calls) -> list[str]:
    return [c.messages[-1]["content"] for c in calls]


async def test_a_sub_agent_s_calls_are_on_its_trajectory_alone_and_the_outer_names_it(async_client, art_store):
    @art.rollout
    async def researcher(q: str) -> str:
        r = await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.rollout
    async def lead() -> str:
        await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}])
        found = await researcher("dig")  # called plainly: a rollout of its own, inside this one
        await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": found}])
        return found

    outer = await lead.collect()  # no session, no record_calls: the sub-agent is stored all the same
    art_store.flush()
    (inner,) = art_store.trajectories(rollout=researcher.name)
    assert said(outer.calls) == ["plan", "echo: dig"] and [c.index for c in outer.calls] == [0, 1]
    assert said(inner.calls) == ["dig"]
    assert outer.metadata["children"] == [inner.id] and inner.metadata["parent"] == outer.id
    assert not outer.warnings and not inner.warnings
    stored = art_store.get(outer.id)
    assert stored.metadata["children"] == [inner.id] and len(stored.calls) == 2
    # every call the two made is on exactly one of them
    assert len(outer.calls) + len(inner.calls) == 3


async def test_a_gather_inside_a_rollout_counts_each_call_once(async_client, art_store):
    @art.rollout
    async def worker(q: str) -> str:
        r = await async_client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.rollout
    async def lead() -> int:
        groups = await art.gather(worker, ["a", "b"], group_size=2)
        return sum(len(g) for g in groups)

    (group,) = await art.gather(lead, [art.Args()], group_size=1)
    (outer,) = group.trajectories
    assert outer.calls == [] and len(outer.metadata["children"]) == 4
    inner = [art_store.get(i) for i in outer.metadata["children"]]
    assert sorted(len(t.calls) for t in inner) == [1, 1, 1, 1]
    assert all(t.metadata["parent"] == outer.id for t in inner)
    assert not any(w.startswith("no LLM call") for w in outer.warnings)  # its calls are its children's


def test_a_plain_sub_agent_outside_any_kept_rollout_writes_nothing(sync_client, tmp_path):
    @art.rollout
    def inner() -> str:
        return sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]) \
            .choices[0].message.content

    @art.rollout
    def outer() -> str:
        return inner()

    art.configure(store=str(tmp_path / "s.db"))
    try:
        assert outer() == "echo: x"  # a unit test calling decorated code: no files
    finally:
        art.configure(store=None)
    assert not (tmp_path / "s.db").exists()


# -- a session on the local backend: the client's record and the endpoint's ------------------

@pytest.fixture
async def opened(tmp_path):
    pytest.importorskip("torch")
    from backends.local import LocalBackend

    model = art.TrainableModel("tiny-agent", base_model="tiny", project="t")
    async with art.session(model, LocalBackend(device="cpu", home=str(tmp_path / "home"))) as run:
        yield run


class Verdict(BaseModel):
    label: str


async def test_a_parse_that_raises_after_the_answer_is_one_call_with_its_tokens(opened):
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent() -> str:
        try:
            await client.chat.completions.parse(model="tiny-agent", messages=[{"role": "user", "content": "label"}],
                                                response_format=Verdict, max_tokens=2, extra_body={"min_tokens": 2})
        except LengthFinishReasonError:
            return "cut"
        return "parsed"

    traj = await agent.collect()
    assert traj.outcome == "cut" and traj.error is None
    (call,) = traj.calls  # not the client's record and the endpoint's side by side
    assert call.error.startswith("LengthFinishReasonError")
    assert call.served_by == "tiny-agent@0" and len(call.choices[0].token_ids) == 2 and call.prompt_token_ids
    assert traj.metadata["calls_recorded"] == {"client": 0, "endpoint": 1, "matched": 1, "endpoint_only": 0,
                                               "client_only": 0}
    assert not [w for w in traj.warnings if w.startswith(MISMATCH)]


async def test_a_response_hook_that_raises_after_the_answer_is_one_call(opened):
    async def reject(response: httpx.Response) -> None:  # the agent's own check of what came back
        await response.aread()
        raise ValueError("rejected by the agent's response hook")

    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0,
                         http_client=httpx.AsyncClient(event_hooks={"response": [reject]}))

    @art.rollout
    async def agent() -> str:
        try:
            await client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3)
        except Exception as e:  # noqa: BLE001 - the client wraps it as a connection error
            return type(e).__name__
        return "answered"

    traj = await agent.collect()
    assert traj.error is None and traj.outcome != "answered", (traj.error, traj.outcome)
    (call,) = traj.calls
    assert call.error and call.choices and call.choices[0].token_ids
    assert not [w for w in traj.warnings if w.startswith(MISMATCH)]


async def test_a_nested_rollout_in_a_session_reconciles_its_own_calls(opened, art_store):
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    async def ask(text: str) -> str:
        r = await client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": text}],
                                                 max_tokens=3)
        return r.choices[0].message.content or ""

    @art.rollout
    async def helper() -> str:
        return await ask("help")

    @art.rollout
    async def agent() -> str:
        await ask("first")
        await helper()
        return await ask("last")

    outer = await agent.collect()
    art_store.flush()
    (inner,) = art_store.trajectories(rollout=helper.name)
    assert len(outer.calls) == 2 and len(inner.calls) == 1
    for t, n in ((outer, 2), (inner, 1)):  # each matched one for one with the endpoint's record of it
        assert t.metadata["calls_recorded"] == {"client": n, "endpoint": n, "matched": n, "endpoint_only": 0,
                                                "client_only": 0}, t.id
        assert all(c.choices[0].token_ids for c in t.calls)


async def test_calls_to_other_models_pass_through_untouched_and_are_never_trained(opened, server):
    anthropic = pytest.importorskip("anthropic")
    trainable = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)
    judge = AsyncOpenAI(base_url=server.base_url, api_key="user-key", max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=server.base_url.removesuffix("/v1"), api_key="user-key", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]

    async def others() -> str:
        r = await judge.chat.completions.create(model="gpt-judge", messages=hi)
        m = await claude.messages.create(model="claude-x", max_tokens=5, messages=hi)
        return r.choices[0].message.content + " / " + m.content[0].text

    @art.rollout
    async def agent() -> str:
        await trainable.chat.completions.create(model="tiny-agent", messages=hi, max_tokens=3)
        return await others()

    def as_sent(requests):  # what a server can tell of a request, less what varies from one to the next
        return [(r["body"], {k: v for k, v in r["headers"].items() if k not in ("host", "content-length")})
                for r in requests]

    start = len(server.requests)
    assert await others() == "echo: hi / echo: hi"  # the same calls outside any rollout
    plain = as_sent(server.requests[start:])
    traj = await agent.collect()
    assert traj.error is None and traj.outcome == "echo: hi / echo: hi"
    inside = as_sent(server.requests[start + 2:])
    assert inside == plain  # the same bodies and headers: the agent's key, nothing of ours added
    assert not [k for _, h in inside for k in h if k.startswith("x-artsdk")]
    assert [c.model for c in traj.calls] == ["tiny-agent", "gpt-judge", "claude-x"]  # all on the trajectory ...
    assert traj.metadata["calls_recorded"]["client"] == 1
    from backends.local.batch import segments  # the trainer's reading of a trajectory: one call to train
    read = segments(traj, 1.0, opened.backend.models["tiny-agent"].tokenizing())
    assert len(read.segments) == 1 and read.other_calls == 2


async def test_a_client_on_an_http2_transport_is_captured_token_exact(opened):
    # the patch sits on the openai resource, above whatever transport the client brings
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0,
                         http_client=httpx.AsyncClient(http2=True))

    @art.rollout
    async def agent() -> str:
        r = await client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3)
        return r.choices[0].message.content or ""

    traj = await agent.collect()
    (call,) = traj.calls
    assert traj.error is None and call.choices[0].token_ids and call.prompt_token_ids
    assert traj.metadata["calls_recorded"]["matched"] == 1 and not traj.warnings
