"""``art.Judge``: a group reward asked of a judge model -- a scripted judge on 127.0.0.1 (a
malformed answer asked again, one that stays malformed an error naming the judge, answers
cached by content, the call kept on each trajectory and never trained) and the embedded
SmolLM2 itself as the judge, served by the local backend."""

import json

import pytest
from openai import AsyncOpenAI

import artsdk as art
from artsdk.testing.mock_server import MockServer

pytestmark = pytest.mark.anyio


def judge_script(answers):
    """A judge that answers, in turn, each of ``answers`` (the last one again after that)."""
    seen = []

    def script(messages):
        if not messages or "candidate" not in str(messages[0].get("content", "")).lower():
            return None  # not a judge's request: the usual echo
        seen.append(messages)
        return answers[min(len(seen), len(answers)) - 1]

    return script, seen


async def gathered(agent_server, n=3):
    client = AsyncOpenAI(base_url=agent_server.base_url, api_key="k")

    @art.rollout
    async def answer(q: str) -> str:
        r = await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": q}], n=1)
        return r.choices[0].message.content

    return answer, client


async def test_a_scripted_judge_scores_retries_caches_and_is_recorded(server, art_store):
    good = json.dumps({"scores": [{"candidate": 1, "score": 0.2, "reason": "meh"},
                                  {"candidate": 2, "score": 0.9, "reason": "best"},
                                  {"candidate": 3, "score": 0.5, "reason": "ok"}]})
    script, seen = judge_script(["I think they are all fine!", good])
    with MockServer(script=script) as judge_server:
        judge = art.Judge("Say something useful.", model="judge-m", base_url=judge_server.base_url, api_key="j")
        agent, client = await gathered(server)
        (group,) = await art.gather(agent, ["question"], group_size=3, rewards=[judge])
        assert [t.reward for t in group] == [0.2, 0.9, 0.5]  # after one malformed answer, asked again
        assert len(seen) == 2 and "not valid" in seen[1][-1]["content"] and judge.calls_made == 2
        for t in group:  # the judge's call kept on each trajectory, marked; the agent's conversation unchanged
            agent_call, judge_call = t.calls
            assert judge_call.params["judge"] == "judge" and judge_call.model == "judge-m"
            assert t.messages[-1]["content"].startswith("echo: ") and t.last_message == agent_call.message
            assert "Say something useful." in judge_call.messages[-3]["content"]
        stored = art_store.get(group[0].id)
        assert [c.params.get("judge") for c in stored.calls] == [None, "judge"]
        # the same candidates again: the cached answer, no new call
        rescored = await art.replay.rescore(group.trajectories, rewards=[judge])
        assert [t.reward for t in rescored] == [0.2, 0.9, 0.5] and judge.calls_made == 2
        await client.close()


async def test_a_judge_that_keeps_failing_says_so(server):
    script, seen = judge_script(['{"scores": [{"score": 7}]}'])
    with MockServer(script=script) as judge_server:
        judge = art.Judge("Be useful.", model="judge-m", base_url=judge_server.base_url, retries=2, name="critic")
        agent, client = await gathered(server)
        with pytest.raises(art.RewardError, match=r"judge 'critic' \(judge-m\) gave no valid answer in 3 tries; the "
                                                  r"last: \"scores\" must be a list of 2 entries"):
            await art.gather(agent, ["q"], group_size=2, rewards=[judge])
        assert len(seen) == 3
        await client.close()


async def test_judge_calls_are_never_trained(server, tmp_path):
    from backends.local import LocalBackend
    from backends.local.batch import segments

    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    await be.register(art.TrainableModel("agent", base_model="tiny"))
    tk = be.models["agent"].tokenizing()
    t = art.testing.trajectory([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], model="agent")
    t.calls[0].choices[0].token_ids, t.calls[0].choices[0].logprobs = [5, 6], [-1.0, -1.0]
    judge_call = t.calls[0].model_copy(deep=True)
    judge_call.params["judge"] = "judge"  # even one the trainable model itself answered
    t.calls.append(judge_call)
    tokens = segments(t, 1.0, tk)
    assert sum(s.n_trained for s in tokens.segments) == 2 and tokens.other_calls == 0
    await be.close()


async def test_the_embedded_model_as_the_judge(server, tmp_path):
    """SmolLM2-135M, served by the local backend in a session, judges a group: its answer is
    either valid scores, or -- asked again with what was wrong -- an error naming it."""
    from backends.local import LocalBackend

    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    judge_model = art.TrainableModel("smol-judge", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    agent, client = await gathered(server)
    async with art.session(judge_model, backend=be):
        judge = art.Judge("Answer the question politely.", model="smol-judge", retries=1)
        try:
            (group,) = await art.gather(agent, ["hello"], group_size=2, rewards=[judge])
        except art.RewardError as e:
            assert "judge 'judge' (smol-judge) gave no valid answer in 2 tries; the last:" in str(e)
            assert judge.calls_made == 2
        else:
            assert all(0 <= t.reward <= 1 for t in group) and judge.calls_made in (1, 2)
            assert all(t.calls[-1].served_by.startswith("smol-judge@") for t in group)  # routed to the backend
    await client.close()
    await be.close()
