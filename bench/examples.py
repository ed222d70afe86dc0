"""Does each example learn? Train it from the base model on several seeds, each in a fresh
folder (its own store and checkpoints), exactly as ``python -m examples.<name>.train --seed N``
does, and set the held-out results beside simple baselines on the same scenarios and rewards.

    python -m bench.examples tic_tac_toe [--seeds 0 1] [--steps 20 ...]    # options go to the example
    python -m bench.examples email_agent --model-url http://host:8000/v1 --model Qwen/Qwen2.5-7B-Instruct
    python -m bench.examples temporal_clue --seeds 0 1 --control sft          # the warm-up-only control
    python -m bench.examples --plot-only                                     # redraw from the results

Writes bench/results/example_<name>.json (every seed's evaluations, each held-out scenario's
reward, steps and time, the baselines, the commands) and docs/img/example_<name>.png (the
curves), then rewrites docs/examples.md, every figure with its standard error and every gain
paired on the same scenarios (bench/stats.py). A baseline that chooses at random is scored as
its expected value over ``DRAWS`` draws, with the spread of one draw. ``--control sft`` runs go
beside the GRPO runs: after the same warm-up, each step trains supervised on the scripted
answers to the same scenarios, so the page shows what GRPO added over more supervision. A
model by URL (any OpenAI-compatible endpoint) is evaluated on the same held-out scenarios,
greedily, and added as a baseline; nothing is trained then.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import artsdk as art
from bench.common import RESULTS, save_result

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
NAMES = ["reviews", "tic_tac_toe", "game_2048", "temporal_clue", "email_agent"]
DRAWS = 200  # draws of a random baseline on the held-out set


def example_of(name: str) -> Any:
    return importlib.import_module(f"examples.{name}.train").EXAMPLE


def train_seed(name: str, seed: int, options: list[str]) -> dict[str, Any]:
    """One training run from the base model, in a folder of its own, as a user runs it."""
    with tempfile.TemporaryDirectory(prefix=f"artsdk-{name}-{seed}-") as folder:
        out = Path(folder) / "result.json"
        args = ["--seed", str(seed), *options]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ARTSDK_", "OPENAI_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if os.environ.get("ARTSDK_CACHE"):  # converted base models may be reused
            env["ARTSDK_CACHE"] = os.environ["ARTSDK_CACHE"]
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-u", "-m", f"examples.{name}.train", *args, "--out", str(out)],
                             cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:  # what the user would see, labelled
            if not line.startswith(("Loading", "Converting", "Writing")):
                print(f"[{name} seed {seed}] {line}", end="", flush=True)
        if p.wait():
            raise SystemExit(f"{name} seed {seed} failed (exit {p.returncode}); its output is above")
        result = json.loads(out.read_text())
    result.update(seed=seed, seconds=round(time.monotonic() - t0, 1),
                  command=f"python -m examples.{name}.train {' '.join(args)}".strip())
    return result


async def scored(example: Any, cfg: dict[str, Any], held_out: list[Any], outcomes: list[Any]) -> dict[str, Any]:
    """Mean reward and share solved of outcomes on the held-out scenarios, as the example scores them."""
    rollout, rewards = example.rollout, example.rewards_for(cfg) if example.rewards_for else example.rewards
    trajs = []
    for scenario, outcome in zip(held_out, outcomes):
        args, kwargs = (scenario.args, scenario.kwargs) if isinstance(scenario, art.Args) else ((scenario,), {})
        trajs.append(art.Trajectory(rollout=rollout.name, outcome=outcome,
                                    scenario=dict(rollout.signature.bind(*args, **kwargs).arguments)))
    trajs = await art.replay.rescore(trajs, rewards, groups=False) if rewards else trajs
    rewards_ = [t.reward for t in trajs]
    solved = sum(bool(example.success(t)) for t in trajs) / len(trajs) if example.success else None
    return {"reward": sum(rewards_) / len(rewards_), "solved": solved, "scenarios": len(trajs), "each": rewards_}


async def baselines(example: Any, cfg: dict[str, Any], draws: int = DRAWS) -> dict[str, Any]:
    """Each baseline on the held-out scenarios: a scripted one once, with the standard error of
    its mean over the scenarios; a random one as its expected value over ``draws`` draws, with
    the spread of one draw's mean."""
    from bench.stats import expected, mean_se
    from examples.streams import held_out as held_out_of

    held_out = held_out_of(example.make_scenarios, cfg)
    if not example.baselines:
        return {}
    rows: dict[str, Any] = {}
    for label, outcomes in example.baselines(held_out, cfg, 0).items():
        row = await scored(example, cfg, held_out, outcomes)
        if label in example.random_baselines:
            runs = [row] + [await scored(example, cfg, held_out, example.baselines(held_out, cfg, d)[label])
                            for d in range(1, draws)]
            row = {**expected([r["each"] for r in runs]), "scenarios": len(held_out),
                   "solved": sum(r["solved"] for r in runs) / len(runs) if row["solved"] is not None else None}
        row["se"] = mean_se(row["each"])[1]
        rows[label] = row
    return rows


async def by_url(example: Any, cfg: dict[str, Any], url: str, model: str, api_key: str) -> dict[str, Any]:
    """A model behind any OpenAI-compatible URL, through the example's own agent, greedily (or at
    the config's ``eval_temperature``, as the trained model is evaluated)."""
    from openai import AsyncOpenAI

    from examples.runner import evaluate
    from examples.streams import held_out as held_out_of

    agent = importlib.import_module(example.rollout.fn.__module__)
    client = AsyncOpenAI(base_url=url, api_key=api_key)
    saved = agent.client, agent.MODEL
    agent.client, agent.MODEL = client, model
    try:
        held_out = held_out_of(example.make_scenarios, cfg)
        rewards = example.rewards_for(cfg) if example.rewards_for else example.rewards
        mean, rate, trajs = await evaluate(example.rollout, held_out, rewards, example.success,
                                           cfg.get("eval_temperature", 0.0))
    finally:
        agent.client, agent.MODEL = saved
        await client.close()
    failed = sum(t.error is not None for t in trajs)
    return {"reward": mean, "solved": rate, "scenarios": len(trajs), "failed": failed, "url": url,
            "each": [t.reward for t in trajs]}


def plot(name: str, data: dict[str, Any], path: Path) -> None:
    """Held-out reward at each evaluation (thick) and the training batches' mean reward (thin),
    per seed, beside the baselines (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(data["runs"]):
        c = colors[i % len(colors)]
        evals = [(0, run["before"])] + [(e["step"], e["reward"]) for e in run.get("evals", [])]
        ax.plot(*zip(*evals), marker="o", color=c, linewidth=2, label=f"held-out, seed {run['seed']}")
        batches = [(h["step"], h["reward"]) for h in run["history"] if "reward" in h]
        if batches:
            ax.plot(*zip(*batches), color=c, linewidth=0.8, alpha=0.5, label=f"training batches, seed {run['seed']}")
        warm = [h["step"] for h in run["history"] if h.get("sft") and not h.get("control")]
        if warm and i == 0:
            ax.axvspan(0, warm[-1], color="gray", alpha=0.12, label="SFT warm-up")
    for i, run in enumerate(data.get("controls", [])):  # the same warm-up, then supervised steps instead of GRPO
        evals = [(0, run["before"])] + [(e["step"], e["reward"]) for e in run.get("evals", [])]
        ax.plot(*zip(*evals), marker="s", color=colors[i % len(colors)], linewidth=1.2, linestyle="--",
                label=f"control (SFT instead of GRPO), seed {run['seed']}")
    styles = iter([":", "--", "-."])
    for label, b in data.get("baselines", {}).items():
        ax.axhline(b["reward"], color="black", linestyle=next(styles, "--"), linewidth=1, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"{name}: {data['base_model'].split('/')[-1]} on {data['device']}")
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _settings(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in ("seed", "out", "resume", "control", "max_policy_lag")}


def run(name: str, seeds: list[int], options: list[str], url: str | None, model: str | None, key: str) -> None:
    from examples.runner import load_config

    example = example_of(name)
    cfg = load_config(example.config, options)
    path = RESULTS / f"example_{name}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    data: dict[str, Any] = {"example": name, "base_model": cfg["base_model"], "device": "CPU", "runs": [],
                            "baselines": old.get("baselines", {}), "machine": f"{os.cpu_count()} CPU cores, "
                            f"{platform.machine()}"}
    control = cfg.get("control")
    # a control's runs, and pipelined runs (run.loop), are kept beside the sequential GRPO runs
    where = "controls" if control else "pipelined" if cfg.get("max_policy_lag") is not None else "runs"
    data.update({k: old[k] for k in ("runs", "controls", "pipelined", "config", "command", "control_command",
                                     "pipelined_command", "budget_seconds", "note") if k in old})
    runs: list[dict[str, Any]] = []
    for seed in seeds:  # saved after each seed: a benchmark cut short keeps the seeds it finished
        runs.append(train_seed(name, seed, options))
        # other seeds' runs as they are on disk now: another benchmark may have run them meanwhile
        fresh = json.loads(path.read_text()) if path.is_file() else {}
        kept = [r for r in fresh.get(where, []) if r["seed"] not in seeds]
        same = lambda r: _settings(r["config"]) == _settings(runs[0]["config"])  # noqa: E731
        data[where] = sorted([r for r in kept if same(r)] + runs, key=lambda r: r["seed"])
        command = f"python -m bench.examples {name} --seeds {' '.join(str(r['seed']) for r in data[where])}" \
                  + "".join(f" {o}" for o in options)
        if where != "runs":
            data[{"controls": "control_command", "pipelined": "pipelined_command"}[where]] = command
        else:
            data["config"], data["command"] = runs[0]["config"], command
            data["budget_seconds"] = max(r["seconds"] for r in data["runs"])
        save_result(f"example_{name}", data)
    # recomputed each time (expected values over draws, per-scenario figures); models by URL are kept
    data["baselines"] = {**asyncio.run(baselines(example, cfg)),
                         **{k: v for k, v in old.get("baselines", {}).items() if "url" in v}}
    if url:
        data["baselines"][f"{model} (by URL)"] = asyncio.run(by_url(example, cfg, url, model or "default", key))
    save_result(f"example_{name}", data)
    if data["runs"]:
        plot(name, data, IMG / f"example_{name}.png")
    for r in data.get("runs", []) + data.get("controls", []):
        print(f"{name} seed {r['seed']}{' (control)' if r.get('control') else ''}: held-out {r['before']:.3f} -> "
              f"{r['after']:.3f} ({r['seconds'] / 60:.1f} min)")
    for label, b in data["baselines"].items():
        print(f"{name} baseline {label}: {b['reward']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", choices=NAMES)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    ap.add_argument("--model-url", help="also evaluate a model behind this OpenAI-compatible URL")
    ap.add_argument("--model", help="its model name")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    ap.add_argument("--plot-only", action="store_true", help="redraw every picture and the page from the results")
    a, options = ap.parse_known_args()
    if a.plot_only:
        for name in NAMES:
            p = RESULTS / f"example_{name}.json"
            data = json.loads(p.read_text()) if p.is_file() else {}
            if data.get("runs"):
                plot(name, data, IMG / f"example_{name}.png")
    elif a.name is None:
        ap.error("name an example (or --plot-only)")
    else:
        run(a.name, a.seeds, options, a.model_url, a.model, a.api_key)
    from bench.examples_page import examples_page

    examples_page()


if __name__ == "__main__":
    main()
