"""A driver of the ray backend as a process of its own, for the test that kills one mid-run:
it joins the Ray instance at argv[1], commits its steps at argv[3] (home argv[2]), trains
argv[4] steps, printing "committed <step>" after each, then starts a long step and says
"training" (the test kills it there)."""

import asyncio
import sys

import artsdk as art
from backends.local import LocalBackend
from backends.ray import RayBackend
from tests.test_trust_region import batch


async def main(address: str, home: str, url: str, steps: int) -> None:
    tokens = LocalBackend(device="cpu", dtype="float32", home=f"{home}-tokens", http=False)
    model = art.TrainableModel("m", base_model="tiny", project="p", config={"train": {"learning_rate": 1e-2}})
    await tokens.register(model)
    groups = batch(tokens.models["m"], groups=2, size=4)
    be = RayBackend(address=address, device="cpu", dtype="float32", home=home, replicas=1, trainers=1,
                    checkpoints_url=url, health_interval_s=0.5)
    await be.register(model)
    for _ in range(steps):
        result = await be.train(model, groups)
        print(f"committed {result.step}", flush=True)
    step = asyncio.ensure_future(be.train(model, groups, epochs=4000))
    await asyncio.sleep(3)
    print("training", flush=True)
    await step


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
