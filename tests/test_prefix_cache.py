"""The built-in engine's prefix cache: a conversation's later turns, a group's members and a
shared system prompt reuse the keys and values already computed -- and the answers are the
same as with the cache off, token for token (greedy and seeded), with the same logprobs;
a new step never reuses an older step's keys; a retired step's entries go; the budget holds."""

import concurrent.futures

import pytest
import torch

import artsdk as art
from artsdk.testing import trajectory
from backends.local import LocalBackend
from backends.local.engine import Request
from backends.local.prefix_cache import PrefixCache
from tests.conftest import DEVICE

pytestmark = pytest.mark.anyio


async def pair(tmp_path):
    """Two backends on the same tiny model, the prefix cache off and on."""
    out = []
    for mb in (0, 64):
        be = LocalBackend(device=DEVICE, dtype="float32", home=str(tmp_path / f"c{mb}"), http=False,
                          prefix_cache_mb=mb)
        await be.register(art.TrainableModel("m", base_model="tiny"))
        out.append(be)
    return out


def ask(served, prompt, **kw):
    return served.submit(Request(prompt=list(prompt), **{"max_tokens": 12, "temperature": 0.0, **kw}))


def conversation(served, turns=4, **kw):
    """A conversation of ``turns`` calls, each prompt the last one's plus its answer plus a user turn."""
    prompt = served.chat.prompt_ids([{"role": "user", "content": "tell me a story"}])
    outs = []
    for k in range(turns):
        (c,) = ask(served, prompt, **kw).result(120)
        outs.append((list(c.token_ids), list(c.logprobs)))
        prompt = prompt + list(c.token_ids) + served.chat.encode(f"\nuser says {k}\n")
    return outs


def same(a, b):
    assert [x[0] for x in a] == [x[0] for x in b]  # the tokens, exactly
    for (_, la), (_, lb) in zip(a, b):
        assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-4, rtol=0)


async def test_later_turns_reuse_the_cache_and_answer_exactly_as_without_it(tmp_path):
    off, on = await pair(tmp_path)
    a, b = off.models["m"], on.models["m"]
    for kw in ({}, {"temperature": 1.0, "seed": 7}):
        same(conversation(a, **kw), conversation(b, **kw))
    stats = b.engine.prefix_cache.stats
    assert stats["hits"] >= 6 and stats["tokens_reused"] > 0.6 * stats["tokens_asked"], stats
    assert a.engine.prefix_cache is None
    # a batch that mixes prompts with and without a cached prefix, of different lengths, and n > 1
    base = b.chat.prompt_ids([{"role": "user", "content": "tell me a story"}])
    prompts = [base, base + [5, 6, 7], b.chat.prompt_ids([{"role": "user", "content": "something else"}]), base[:-2]]

    def batch(served):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # submitted together: one batch
            futures = list(pool.map(lambda p: ask(served, p, n=2, temperature=1.0, seed=3), prompts))
        return [(list(c.token_ids), list(c.logprobs)) for f in futures for c in f.result(120)]

    same(batch(a), batch(b))
    await off.close()
    await on.close()


async def test_a_new_step_never_reuses_an_older_steps_keys_and_a_retired_step_lets_go(tmp_path):
    off, on = await pair(tmp_path)
    a, b = off.models["m"], on.models["m"]
    conversation(b, turns=2)
    cache = b.engine.prefix_cache
    prompt = b.chat.prompt_ids([{"role": "user", "content": "tell me a story"}])
    assert cache.lookup(0, tuple(prompt) + (1,))[0] > 0
    for be in (off, on):  # the same step on both
        served = be.models["m"]
        t = trajectory([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}], model="m",
                       token_ids=[10, 11, 12], logprobs=[-2.0] * 3)
        t.calls[0].prompt_token_ids = served.chat.prompt_ids([{"role": "user", "content": "go"}])
        u = t.model_copy(deep=True, update={"id": "other"})
        u.calls[0].choices[0].token_ids = [20, 21, 22]
        t.reward, u.reward = 1.0, 0.0
        await be.train(art.TrainableModel("m", base_model="tiny"), [art.Group(trajectories=[t, u])],
                       learning_rate=5e-2)
    assert b.step == 1 and cache.lookup(1, tuple(prompt) + (1,))[0] == 0  # step 0's keys are not step 1's
    same(conversation(a, turns=3), conversation(b, turns=3))  # answered by step 1, cached on step 1
    assert any(e.step == 1 for e in cache._entries.values())
    b.engine.retire(1)
    assert not any(e.step == 1 for e in cache._entries.values())
    await off.close()
    await on.close()


def test_the_budget_is_kept_least_recently_used_first():
    kv = lambda n: [(torch.zeros(2, n, 4), torch.zeros(2, n, 4))]  # noqa: E731 - 64 bytes a token
    cache = PrefixCache(budget=64 * 25)
    cache.store(0, tuple(range(10)), kv(10))
    cache.store(0, tuple(range(100, 110)), kv(10))
    assert cache.lookup(0, tuple(range(12)))[0] == 10  # the first is used: now the most recent
    cache.store(0, tuple(range(200, 210)), kv(10))  # over budget: the least recently used goes
    assert cache.lookup(0, tuple(range(100, 112)))[0] == 0 and cache.lookup(0, tuple(range(12)))[0] == 10
    assert cache.used <= cache.budget and cache.stats["evicted"] == 1
    cache.store(0, tuple(range(20)), kv(20))  # extends the first: which is dropped, not kept twice
    assert sum(1 for e in cache._entries.values() if e.tokens[0] == 0) == 1
    assert cache.lookup(0, (0, 1, 2))[0] == 2  # the prompt's last token is always computed
    assert cache.lookup(1, tuple(range(12)))[0] == 0  # another step: nothing
    cache.store(0, tuple(range(1000)), kv(1000))  # larger than the whole budget: not kept
    assert cache.used <= cache.budget


def test_the_option_is_checked():
    with pytest.raises(art.BackendError, match="prefix_cache_mb"):
        LocalBackend(device="cpu", prefix_cache_mb=-1)
