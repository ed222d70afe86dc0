"""@art.rollout, collect and gather against the loopback server."""

import logging
import random

import anyio
import pytest
from openai import AsyncOpenAI, OpenAI

import artsdk as art

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(server):
    c = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    yield c
    await c.close()


async def test_two_hundred_concurrent_rollouts_keep_their_own_calls(client, art_store):
    @art.rollout
    async def agent(n: int):
        # several calls per rollout, interleaved with the other 199 rollouts
        seen = []
        for turn in range(3):
            await anyio.sleep(random.random() / 100)
            msg = f"sleep 0.00{random.randint(0, 5)} r{n} t{turn}"
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": msg}])
            seen.append(r.choices[0].message.content)
        return seen

    groups = await art.gather(agent, range(50), group_size=4, concurrency=200)
    assert len(groups) == 50 and all(len(g) == 4 for g in groups)
    for n, g in enumerate(groups):
        for t in g:
            assert t.error is None and len(t.calls) == 3
            for turn, call in enumerate(t.calls):
                asked = call.messages[0]["content"]
                assert f" r{n} t{turn}" in asked
                assert call.message["content"] == f"echo: {asked}"
    assert art_store.count() == 200
    stored = art_store.trajectories(group_id=groups[7].id)
    assert {t.id for t in stored} == {t.id for t in groups[7]}
    assert all(" r7 t2" in t.calls[2].messages[0]["content"] for t in stored)


async def test_plain_async_call_returns_and_sync_rollout_collects(server, art_store):
    sync_client = OpenAI(base_url=server.base_url, api_key="k")

    @art.rollout(name="sync-agent")
    def sync_agent(q: str, loud: bool = False) -> str:
        text = sync_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": q}]).choices[0].message.content
        return text.upper() if loud else text

    assert sync_agent("x") == "echo: x"
    t = await sync_agent.collect("y", loud=True)
    assert t.outcome == "ECHO: Y" and t.rollout == "sync-agent"
    assert t.scenario == {"q": "y", "loud": True}
    groups = await art.gather(sync_agent, [art.Args("z", loud=True)], group_size=2)
    assert [t.outcome for t in groups[0]] == ["ECHO: Z", "ECHO: Z"]
    assert art_store.get(t.id).scenario == {"q": "y", "loud": True}


async def test_errors_retries_and_timeouts_are_recorded_not_lost(client, art_store):
    attempts = {"n": 0}

    @art.rollout
    async def flaky(kind: str):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": kind}])
        if kind == "flaky":
            attempts["n"] += 1
            if attempts["n"] < 3:
                raise RuntimeError(f"attempt {attempts['n']} failed")
        if kind == "slow":
            await anyio.sleep(5)
        if kind == "broken":
            raise ValueError("always broken")
        return "ok"

    groups = await art.gather(flaky, ["flaky", "slow", "broken"], retries=2, timeout=0.5)
    flaky_t, slow_t, broken_t = (g[0] for g in groups)
    assert flaky_t.error is None and flaky_t.attempt == 2 and flaky_t.outcome == "ok"
    assert slow_t.error.type == "TimeoutError" and "timeout of 0.5 s" in slow_t.error.message
    assert broken_t.error.type == "ValueError" and "always broken" in broken_t.error.traceback
    assert len(broken_t.calls) == 1  # the calls made before the failure are kept
    # every attempt is in the store: 3 flaky + 3 slow + 3 broken
    assert art_store.count() == 9 and art_store.count(error=True) == 8
    assert [g.errors for g in groups] == [0, 1, 1]
    # a failed rollout is a trajectory with error set, also through collect()
    t = await flaky.collect("broken")
    assert t.error.type == "ValueError" and art_store.get(t.id).error.message == "always broken"


async def test_rollout_without_llm_calls_warns(art_store, caplog):
    @art.rollout
    async def lazy(x):
        return x * 2

    t = await lazy.collect(2)
    assert t.outcome == 4 and "no LLM call was captured" in t.warnings[0]
    with caplog.at_level(logging.WARNING, logger="artsdk"):
        await art.gather(lazy, [1, 2], group_size=2)
    assert "4 of 4 rollouts made no LLM call" in caplog.text


async def test_gather_flags_no_signal_and_raises_reward_errors_after_storing(client, art_store):
    @art.rollout
    async def agent(q):
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    @art.reward
    def random_reward(t):
        return random.random()

    @art.reward
    def constant(t):
        return 1.0

    groups = await art.gather(agent, ["a", "b"], group_size=3, rewards=[constant])
    assert all(g.no_signal for g in groups)
    groups = await art.gather(agent, ["a"], group_size=3, rewards=[random_reward])
    assert not groups[0].no_signal

    @art.reward
    def bad(t):
        return "high"

    with pytest.raises(art.RewardError, match="reward 'bad' returned 'high'.*stored unscored"):
        await art.gather(agent, ["c"], group_size=2, rewards=[bad])
    assert art_store.count(rollout=agent.name) == 6 + 3 + 2
    unscored = art_store.trajectories(newest_first=True, limit=2)
    assert all(t.reward is None and "reward 'bad'" in t.warnings[0] for t in unscored)


async def test_collect_applies_default_rewards_and_raises_after_storing(client, art_store):
    @art.reward
    def nan(t):
        return float("nan")

    @art.rollout(rewards=[nan])
    async def agent():
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    with pytest.raises(art.RewardError, match="reward 'nan' returned nan"):
        await agent.collect()
    (t,) = art_store.trajectories()
    assert t.reward is None and "returned nan" in t.warnings[0]


async def test_bad_gather_arguments():
    async def plain():
        return 1

    with pytest.raises(art.RolloutError, match="decorated with @art.rollout"):
        await art.gather(plain, [1])
    with pytest.raises(art.RolloutError, match="group_size must be at least 1"):
        await art.gather(art.rollout(plain), [1], group_size=0)
    with pytest.raises(TypeError, match="rollout 'test_bad_gather_arguments.<locals>.plain'"):
        await art.rollout(plain).collect(1, 2)


async def test_record_calls_setting_stores_plain_calls(client, art_store):
    @art.rollout
    async def agent():
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return 5

    art.configure(record_calls=True, store=str(art_store.path))
    store = art.default_store()
    assert await agent() == 5
    store.flush()
    assert store.count() == 1 and store.trajectories()[0].outcome == 5


def test_the_cut_tool_call_warning_is_only_for_answers_cut_inside_a_tool_call(caplog):
    from artsdk.run.gather import _report
    from artsdk.testing import trajectory

    tools = [{"type": "function", "function": {"name": "search"}}]

    def cut(answer):
        t = trajectory([{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}])
        t.calls[0].tools = tools
        t.calls[0].choices[0].finish_reason = "length"
        return t

    prose = art.Group(trajectories=[cut("The answer is a long sentence that ran out of room before")])
    _report("agent", [prose])
    assert "cut at max_tokens" not in caplog.text  # it was said of prose before
    inside = art.Group(trajectories=[cut('Let me look. <tool_call>{"name": "sear')])
    _report("agent", [prose, inside])
    assert "1 of 2 answers offered tools were cut at max_tokens" in caplog.text


async def test_a_rollout_names_its_scenario_as_binding_the_arguments_would(art_store):
    """The scenario is the call's arguments by name, as inspect binds them -- whatever the
    signature (defaults, keyword-only, positional-only, *args, **kwargs) -- and a call the
    function could not take is refused with the rollout's name, nothing run."""
    import inspect

    ns: dict = {}
    exec("def posonly(a, /, b): return a\ndef posonly_default(a, b=2, /): return a", ns)
    functions = [lambda a: a, lambda a, b=1: a, lambda a, *, c: a, lambda a, b=1, *, c: a,
                 lambda a, *rest: a, lambda a, **kw: a, lambda: 0, lambda a, *, c=2: a,
                 ns["posonly"], ns["posonly_default"]]
    checked = 0
    for k, fn in enumerate(functions):
        agent = art.rollout(name=f"f{k}")(fn)
        for args in [(), (1,), (1, 2), (1, 2, 3)]:
            for kwargs in [{}, {"c": 3}, {"b": 5}]:
                try:
                    want = dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
                except TypeError:
                    with pytest.raises(TypeError, match=f"rollout 'f{k}'"):
                        await agent.collect(*args, **kwargs)
                    continue
                t = await agent.collect(*args, **kwargs)
                assert t.scenario == want, (k, args, kwargs)
                checked += 1
    assert checked == 20
    assert art_store.count() == checked


async def test_a_plain_call_keeps_how_it_ended_whether_it_returned_raised_or_was_stopped(server, art_store):
    """A plain (sync) call of a rollout, with recording on: the trajectory stored says what the
    call returned, the error it raised (raised on, as it was), or that it was stopped (Ctrl-C),
    each with the call it made; ids are random UUIDs (version 4), each its own."""
    import uuid

    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

    @art.rollout
    def agent(how: str) -> str:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": how}])
        if how == "raise":
            raise ValueError("the tool broke")
        if how == "stop":
            raise KeyboardInterrupt
        return how.upper()

    art.configure(record_calls=True, store=str(art_store.path))
    assert agent("fine") == "FINE"
    with pytest.raises(ValueError, match="the tool broke"):
        agent("raise")
    with pytest.raises(KeyboardInterrupt):
        agent("stop")
    art.default_store().flush()
    got = {t.scenario["how"]: t for t in art_store.trajectories()}
    assert got["fine"].outcome == "FINE" and got["fine"].error is None
    assert got["raise"].error.type == "ValueError" and "the tool broke" in got["raise"].error.message
    assert got["stop"].error.type == "Interrupted" and "KeyboardInterrupt" in got["stop"].error.message
    for how, t in got.items():
        assert [c.messages[-1]["content"] for c in t.calls] == [how]
        assert t.ended_at >= t.started_at and t.duration > 0 and "outcome" in t.model_fields_set
        assert uuid.UUID(hex=t.id).version == 4 and uuid.UUID(hex=t.id).hex == t.id
    ids = {art.Trajectory().id for _ in range(10_000)}
    assert len(ids) == 10_000 and all(uuid.UUID(hex=i).version == 4 for i in list(ids)[:100])
    client.close()


def test_a_forked_child_neither_repeats_its_parents_ids_nor_takes_its_rollouts_for_its_own(sync_client):
    """Ids are handed out from a batch made ahead, and the process id capture compares a
    rollout's with is kept rather than asked for: a forked child starts on ids of its own, and a
    call it makes in a rollout's context it inherited is not recorded on that copy as its own
    (its calls reach the rollout by its ``art.rollout_env()`` URL, if at all)."""
    import json
    import os

    from artsdk.trajectory import new_id

    new_id()  # the parent now holds a batch
    seen = []

    @art.rollout
    def agent():
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # the child: a call in the inherited context, then its ids and what it recorded
            try:
                sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                rec = art.capture.current_recorder.get()
                os.write(w, json.dumps({"ids": [new_id() for _ in range(8)], "recorded": len(rec.calls)}).encode())
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(child, 0)
        with os.fdopen(r) as f:
            seen.append(json.loads(f.read()))
        sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}])

    t = agent.collect_sync()
    (got,) = seen
    parent = [new_id() for _ in range(8)]
    assert len(set(got["ids"])) == 8 and not set(got["ids"]) & set(parent) and t.id not in got["ids"]
    assert got["recorded"] == 0
    assert [c.messages[0]["content"] for c in t.calls] == ["y"]  # the parent's own call, recorded once
