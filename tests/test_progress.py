"""No long wait is silent: a training step, a warm-up and a gather print their progress -- the
rows or rollouts done, the rate, the time left -- as lines when the output is not a terminal
(a log, CI), and nothing when asked to be quiet. The local backend, the tiny model."""

import pytest
from openai import AsyncOpenAI

import artsdk as art
from artsdk.run import progress
from backends.local import LocalBackend
from tests.test_trust_region import batch

pytestmark = pytest.mark.anyio


async def test_a_training_step_and_a_gather_print_progress_lines_to_a_non_terminal(tmp_path, art_store, capsys,
                                                                                     monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY", 0.3)  # a line every 0.3 s (30 s by default)
    be = LocalBackend(device="cpu", dtype="float32", home=str(tmp_path / "home"))
    model = art.TrainableModel("m", base_model="tiny", config={"train": {"epochs": 40}})
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)

    @art.rollout
    async def agent(q: str) -> str:
        import asyncio

        await asyncio.sleep(0.1 * int(q[1:]))  # the gather lasts at least 0.5 s, past LINE_EVERY, however fast the machine
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}], max_tokens=3)
        return r.choices[0].message.content

    async with art.session(model, backend=be) as run:
        await run.train(batch(be.models["m"], groups=2, size=4))
        printed = capsys.readouterr().err
        lines = [line for line in printed.split("\n") if "step 1 of m" in line]
        assert lines and "row" in lines[-1] and "/" in lines[-1]  # rows done of all, and the rate
        assert all(line.startswith("step 1 of m") for line in lines)  # whole lines, no bar redrawn with \r
        await art.gather(agent, [f"q{i}" for i in range(6)], group_size=2)
        printed = capsys.readouterr().err
        assert any(line.startswith("gather ") and "rollout" in line for line in printed.splitlines()), printed
        art.configure(progress=False)  # quiet when asked
        await run.train(batch(be.models["m"], groups=2, size=4))
        assert "step 2 of m" not in capsys.readouterr().err
    await be.close()
    await client.close()
