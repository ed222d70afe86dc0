"""Do the default training settings learn, on tasks of different kinds? SmolLM2-135M (CPU):
the held-out greedy score before and after N GRPO steps, seeded.

    python -m bench.learning [--steps 10] [--seeds 0 1] [--tasks add capital json calc ...]
                             [--learning-rate 1e-4 --loss cispo --minibatches 4 ...]   # settings to compare

Tasks: short exact answers (``add``: two-digit addition, ``larger``: the larger of two numbers,
``sentiment``: the demo's review labeller, ``capital``: a country's capital, held-out countries
never trained on), format following (``upper``: a word in capital letters and nothing else, held-out
words never trained on) and multi-turn with a
tool (``calc``: a product asked, a calculator's result given in a second turn, the final answer
trained with both turns). Each step gathers 8 prompts x 8 samples (temperature 1, at most 16
tokens a turn) and trains once; the held-out set is 48 prompts the training never sees,
answered greedily. Each (task, seed) trains a model of its own from the base model. A task's
score is its mean reward (see ``score``). Without settings it measures the defaults; every run
is added to bench/results/learning.json under its settings (replacing an earlier run of the
same task and seed), so a sweep is several commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import tempfile
import time
from typing import Any, Callable

import artsdk as art
from bench.common import RESULTS, pin_threads, save_result
from examples.reviews.agent import prompt, shaped
from examples.reviews.reviews import reviews

GROUPS, GROUP_SIZE, HELD_OUT, MAX_TOKENS = 8, 8, 48, 16

# -- the tasks: a scenario from a seeded generator (held-out ones apart), a reward on the reply --

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
    "Russia": "Moscow", "China": "Beijing", "Egypt": "Cairo", "England": "London", "Canada": "Ottawa",
    "Australia": "Canberra", "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Ireland": "Dublin", "Hungary": "Budapest", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago",
    "Cuba": "Havana", "Thailand": "Bangkok", "Turkey": "Ankara", "Iran": "Tehran", "Iraq": "Baghdad",
    "Belgium": "Brussels", "Netherlands": "Amsterdam", "Switzerland": "Bern", "Romania": "Bucharest",
    "Ukraine": "Kyiv", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "Philippines": "Manila",
    "Nigeria": "Abuja", "Morocco": "Rabat", "Colombia": "Bogota", "Venezuela": "Caracas",
    "Iceland": "Reykjavik", "Lebanon": "Beirut", "Syria": "Damascus", "Afghanistan": "Kabul",
    "Pakistan": "Islamabad", "Nepal": "Kathmandu", "Bangladesh": "Dhaka", "Ghana": "Accra", "Senegal": "Dakar",
    "Jamaica": "Kingston", "Qatar": "Doha",
}
HELD_OUT_COUNTRIES = sorted(CAPITALS)[::4]  # never in a training prompt: the format must carry over


def add(rng: random.Random, held_out: bool) -> dict[str, str]:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    return {"prompt": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)}


def larger(rng: random.Random, held_out: bool) -> dict[str, str]:
    a, b = rng.sample(range(10, 100), 2)
    return {"prompt": f"Which number is larger, {a} or {b}? Reply with the number only.", "answer": str(max(a, b))}


def sentiment(rng: random.Random, held_out: bool) -> dict[str, str]:
    """The review labeller of examples/reviews (the demo)."""
    (review,) = reviews(1, rng.randrange(2**31))
    return {"prompt": prompt(review), "answer": review.label}


def capital(rng: random.Random, held_out: bool) -> dict[str, str]:
    pool = HELD_OUT_COUNTRIES if held_out else [c for c in sorted(CAPITALS) if c not in HELD_OUT_COUNTRIES]
    country = rng.choice(pool)
    return {"prompt": f"What is the capital of {country}? Answer with the city name only.",
            "answer": CAPITALS[country].lower()}


WORDS = ["garden", "river", "window", "silver", "candle", "forest", "bridge", "pocket", "ladder", "orange",
         "winter", "basket", "castle", "hammer", "island", "jacket", "kitten", "lemon", "market", "needle",
         "pencil", "rabbit", "saddle", "tunnel", "velvet", "wallet", "anchor", "bottle", "carpet", "dragon",
         "engine", "feather", "guitar", "helmet", "jungle", "mirror", "napkin", "oyster", "parrot", "rocket",
         "spider", "ticket", "violin", "wizard", "yellow", "zipper", "button", "cookie"]
HELD_OUT_WORDS = WORDS[::4]


def upper(rng: random.Random, held_out: bool) -> dict[str, str]:
    pool = HELD_OUT_WORDS if held_out else [w for w in WORDS if w not in HELD_OUT_WORDS]
    word = rng.choice(pool)
    return {"prompt": f'Write the word "{word}" in capital letters. Reply with the word only.', "answer": word.upper()}


def calc(rng: random.Random, held_out: bool) -> dict[str, str]:
    a, b = rng.randint(12, 49), rng.randint(3, 9)
    return {"prompt": f"What is {a} times {b}?", "answer": str(a * b),
            "followup": f"The calculator says {a} x {b} = {a * b}. Reply with the final answer only, the number."}


TASKS: dict[str, Callable[[random.Random, bool], dict[str, str]]] = {
    "add": add, "larger": larger, "sentiment": sentiment, "capital": capital, "upper": upper, "calc": calc}


def score(reply: str, scenario: dict[str, str]) -> float:
    """The right answer alone 1, the right answer first among the candidates in more text
    0.5 + 0.5 / words (examples/reviews' ``shaped``), else 0. Candidates: a number other than
    those asked about (add, calc), one of the two numbers (larger), a label (sentiment), a
    capital (capital), the word asked about in any case (upper; then only half the credit
    unless it is in capitals)."""
    answer, task = scenario["answer"], scenario["task"]
    words = re.findall(r"[a-z]+|\d+", reply.lower())
    asked = re.findall(r"\d+", scenario["prompt"])
    if task == "upper":
        capitals = answer in re.findall(r"[A-Za-z]+", reply)
        return shaped(words, [w for w in words if w == answer.lower()], answer.lower()) * (1.0 if capitals else 0.5)
    if task == "sentiment":
        candidates = [w for w in words if w in ("positive", "negative")]
    elif task == "larger":
        candidates = [w for w in words if w in asked]
    elif task == "capital":
        capitals = {c.lower() for c in CAPITALS.values()}
        candidates = [w for w in words if w in capitals]
    else:
        candidates = [w for w in words if w.isdigit() and w not in asked]
    return shaped(words, candidates, answer)


def scenarios(task: str, n: int, seed: int, held_out: bool = False) -> list[dict[str, str]]:
    rng = random.Random(f"{task}-{seed}")
    return [{**TASKS[task](rng, held_out), "task": task} for _ in range(n)]


# -- the agent and its reward -----------------------------------------------------------

def build(model_name: str) -> tuple[art.Rollout, Any, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused")  # the session routes it

    @art.rollout
    async def answer(task: dict[str, str], temperature: float = 1.0) -> str:
        messages = [{"role": "user", "content": task["prompt"]}]
        r = await client.chat.completions.create(model=model_name, messages=messages, max_tokens=MAX_TOKENS,
                                                 temperature=temperature)
        if task.get("followup"):  # a second turn, after the tool's result
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": task["followup"]}]
            r = await client.chat.completions.create(model=model_name, messages=messages, max_tokens=MAX_TOKENS,
                                                     temperature=temperature)
        return r.choices[0].message.content or ""

    @art.reward
    def exact(t: art.Trajectory) -> float:
        return score(t.outcome or "", t.scenario["task"])

    return answer, exact, client


async def run_task(task: str, seed: int, settings: dict[str, Any], steps: int, home: str) -> dict[str, Any]:
    import torch

    torch.manual_seed(seed)
    name = f"learn-{task}-{seed}"  # a model of its own: a later run must not resume this one's checkpoints
    rollout, reward, client = build(name)
    model = art.TrainableModel(name, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", project="learning",
                               config={"train": {"seed": seed, **settings}})
    held_out = [art.Args(s, temperature=0.0) for s in scenarios(task, HELD_OUT, 10_000 + seed, held_out=True)]

    async def evaluate() -> float:
        groups = await art.gather(rollout, held_out, group_size=1, rewards=[reward], store=False)
        return statistics.mean(t.reward for g in groups for t in g)

    t0 = time.monotonic()
    async with art.session(model) as run:
        before = await evaluate()
        curve = []
        for step in range(steps):
            groups = await art.gather(rollout, scenarios(task, GROUPS, seed * 1000 + step),
                                      group_size=GROUP_SIZE, rewards=[reward])
            result = await run.train(groups)
            curve.append(round(statistics.mean(t.reward for g in groups for t in g.scored), 4))
            print(f"  {task} seed {seed} step {result.step}: train reward {curve[-1]:.3f}  "
                  f"skipped {result.groups_skipped}/{len(groups)}  {result.metrics['seconds']:.0f}s", flush=True)
        after = await evaluate()
    await client.close()
    print(f"{task} seed {seed}: held-out {before:.3f} -> {after:.3f} ({time.monotonic() - t0:.0f}s)", flush=True)
    return {"task": task, "seed": seed, "before": before, "after": after, "train_reward": curve,
            "seconds": time.monotonic() - t0}


def record(key: str, settings: dict[str, Any], steps: int, run: dict[str, Any]) -> None:
    """Add ``run`` to bench/results/learning.json under its settings, replacing an earlier run
    of the same task and seed."""
    path = RESULTS / "learning.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    entry = data.setdefault("runs", {}).setdefault(key, {"settings": settings, "steps": steps, "runs": []})
    if entry["steps"] != steps:
        entry.update(steps=steps, runs=[])
    entry["runs"] = [r for r in entry["runs"] if (r["task"], r["seed"]) != (run["task"], run["seed"])] + [run]
    save_result("learning", data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--learning-rate", type=float)
    ap.add_argument("--loss")
    ap.add_argument("--scale-rewards", type=lambda s: s.lower() in ("1", "true", "yes"))
    ap.add_argument("--minibatches", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in this process (pinned)")
    a = ap.parse_args()
    pin_threads(a.threads)
    settings = {k: v for k, v in (("learning_rate", a.learning_rate), ("loss", a.loss),
                                  ("scale_rewards", a.scale_rewards), ("minibatches", a.minibatches),
                                  ("epochs", a.epochs)) if v is not None}
    from backends.local.trainer import TrainConfig

    # runs are filed under the settings that matter here, defaults filled in, so a change of default
    # never mixes runs of different settings under one name
    effective = {k: getattr(TrainConfig(), k) for k in ("learning_rate", "loss", "minibatches", "epochs")}
    settings = {**effective, **settings}
    key = json.dumps(settings, sort_keys=True)
    runs = []
    with tempfile.TemporaryDirectory() as home:
        art.configure(home=home, store=f"{home}/store.db", progress=False)
        for task in a.tasks:
            for seed in a.seeds:
                runs.append(asyncio.run(run_task(task, seed, settings, a.steps, home)))
                record(key, settings, a.steps, runs[-1])  # each run kept as soon as it ends
    for task in a.tasks:
        mine = [r for r in runs if r["task"] == task]
        gain = [r["after"] - r["before"] for r in mine]
        print(f"{key} {task}: before {statistics.mean(r['before'] for r in mine):.3f} after "
              f"{statistics.mean(r['after'] for r in mine):.3f} gain {statistics.mean(gain):+.3f} "
              f"(min {min(gain):+.3f})")


if __name__ == "__main__":
    main()
