"""A longer training run of the tic-tac-toe example on SmolLM2-135M (CPU): the reward of
every step and a held-out evaluation before and after, as JSON and a PNG plot.

    python -m bench.reward_curve [--steps 8] [--base-model HuggingFaceTB/SmolLM2-135M-Instruct]

Writes bench/results/reward_curve.json and docs/reward_curve.png.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import artsdk as art
from bench.common import save_result
from examples.runner import load_config, train
from examples.tic_tac_toe.agent import legal_moves, play, result
from examples.tic_tac_toe.train import CONFIG, make_scenarios

ROOT = Path(__file__).resolve().parent.parent


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in data["history"]]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(steps, [h["reward"] for h in data["history"]], marker="o", label="training batch mean reward")
    ax.axhline(data["before"], color="gray", linestyle="--", label=f"held-out eval before ({data['before']:.2f})")
    ax.axhline(data["after"], color="green", linestyle="--", label=f"held-out eval after ({data['after']:.2f})")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"tic-tac-toe, {data['base_model'].split('/')[-1]}, CPU")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    a = ap.parse_args()
    cfg = load_config(CONFIG, ["--steps", str(a.steps), "--base-model", a.base_model])
    cfg["learning_rate"] = a.learning_rate
    with tempfile.TemporaryDirectory() as home:
        art.configure(home=home, store=f"{home}/store.db", progress=False)
        data = asyncio.run(train(cfg, play, [result, legal_moves], make_scenarios))
    data.update(base_model=a.base_model, config=cfg)
    save_result("reward_curve", data)
    plot(data, ROOT / "docs" / "reward_curve.png")


if __name__ == "__main__":
    main()
