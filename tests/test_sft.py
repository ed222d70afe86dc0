"""Supervised warm-up (``run.train_sft``) on the local backend and through ``artsdk serve``:
the tiny model, taught from a JSONL file of conversations with tools, then answers with the
tool call it was shown, served at once by the step the warm-up made; only the assistant's
tokens are trained; stored trajectories work as examples too; bad examples are named."""

import json

import pytest
from openai import AsyncOpenAI

import artsdk as art
from backends.local import LocalBackend
from tests.serve_process import KEY, Serve, free_port

pytestmark = pytest.mark.anyio
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]
CITIES = ["Paris", "Oslo", "Rome", "Lima"]


def conversation(city):
    call = {"id": f"c_{city}", "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": city})}}
    return {"tools": TOOLS, "messages": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": f"weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c_{city}", "content": "sunny"},
        {"role": "assistant", "content": f"{city}: sunny"}]}


def write_jsonl(path):
    path.write_text("".join(json.dumps(conversation(c)) + "\n" for c in CITIES))
    return path


async def ask(endpoint, city):
    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    r = await client.chat.completions.create(model="w", messages=conversation(city)["messages"][:2], tools=TOOLS,
                                             max_tokens=40, temperature=0.0)
    await client.close()
    return r


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_sft_from_a_jsonl_file_teaches_a_tool_call(where, tmp_path, art_store):
    serve = None
    if where == "remote":
        serve = Serve(tmp_path, free_port()).start()
        from backends.remote import RemoteBackend

        be = RemoteBackend(serve.url, api_key=KEY)
    else:
        be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("w", base_model="tiny")
    try:
        async with art.session(model, backend=be) as run:
            before = await ask(run.endpoint, "Paris")
            assert before.choices[0].finish_reason != "tool_calls"  # the untrained tiny model never calls it
            result = await run.train_sft(write_jsonl(tmp_path / "good.jsonl"), learning_rate=1e-2, epochs=40,
                                         batch_size=4)
            m = result.metrics
            assert result.step == 1 and run.step == 1 and result.checkpoint.endswith("/1")
            assert m["examples"] == 4 and m["updates"] == 40 and m["loss"] < 0.2 * m["loss_first_epoch"]
            after = await ask(run.endpoint, "Paris")  # served at once: the step the warm-up made
            assert after.model == "w@1" and after.choices[0].finish_reason == "tool_calls"
            (call,) = after.choices[0].message.tool_calls
            assert call.function.name == "weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        assert art_store.steps(model.project, "w")[0]["metrics"]["sft"] == 1.0
    finally:
        await be.close()
        if serve is not None:
            serve.stop()


async def test_only_the_assistant_s_tokens_are_trained(tmp_path):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    model = art.TrainableModel("w", base_model="tiny")
    async with art.session(model, backend=be) as run:
        served = be.models["w"]
        convo = conversation("Oslo")
        # the assistant's two answers as the model writes them, each closed by its end-of-turn token
        from backends.local.chat import message_text

        expected = sum(len(served.chat.encode(message_text(m))) + 1 for m in convo["messages"] if m["role"] == "assistant")
        result = await run.train_sft([convo], epochs=1)
        assert result.metrics["tokens_trained"] == expected
    await be.close()


async def test_stored_trajectories_of_another_model_distil(tmp_path, server, art_store):
    """A stronger model's runs through the same agent code, read back from the store, are
    examples: their calls (another model's tokens) are retokenized for this one."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="k")

    @art.rollout
    async def agent(city: str) -> str:
        r = await client.chat.completions.create(model="strong", messages=[{"role": "user", "content": city}])
        return r.choices[0].message.content

    @art.reward
    def ok(t: art.Trajectory) -> float:
        return 1.0

    await art.gather(agent, CITIES, rewards=[ok])
    best = art_store.trajectories(rollout=agent.name, min_reward=1.0)
    assert len(best) == 4 and best[0].calls[0].served_by == "strong@0"
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    async with art.session(art.TrainableModel("w", base_model="tiny"), backend=be) as run:
        result = await run.train_sft(best, epochs=1)
        assert result.metrics["examples"] == 4 and result.metrics["tokens_trained"] > 4 * len("echo: ")
    await be.close()
    await client.close()


async def test_bad_examples_are_named(tmp_path):
    be = LocalBackend(device="cpu", home=str(tmp_path / "home"))
    async with art.session(art.TrainableModel("w", base_model="tiny"), backend=be) as run:
        with pytest.raises(art.TrajectoryError, match=r"examples\[1\] has no assistant message"):
            await run.train_sft([conversation("Rome"), {"messages": [{"role": "user", "content": "hi"}]}])
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(conversation("Rome")) + "\n{not json\n")
        with pytest.raises(art.TrajectoryError, match="bad.jsonl, line 2: not JSON"):
            await run.train_sft(bad)
        with pytest.raises(art.BackendError, match="unknown SFT setting"):
            await run.train_sft([conversation("Rome")], lr=1)
        assert run.step == 0  # nothing moved
    await be.close()
