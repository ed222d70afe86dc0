"""The training loop every example shares: evaluate, train for some steps, evaluate again.

    python -m examples.tic_tac_toe.train [--steps 5] [--base-model tiny] [--config FILE]

Settings come from the example's config.toml; the backend (local by default, or remote) and
the store come from the usual artsdk settings, so ``ARTSDK_BACKEND=remote`` switches it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Sequence

import artsdk as art


def load_config(path: Path, argv: Sequence[str] | None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=path)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--base-model")
    ap.add_argument("--group-size", type=int)
    ap.add_argument("--scenarios-per-step", type=int)
    ap.add_argument("--eval-games", type=int)
    ap.add_argument("--out", type=Path, help="write the figures (eval before/after, each step) here as JSON")
    ap.add_argument("--seed", type=int, help="seed of the training scenarios and the adapter's initialisation "
                                              "(the held-out scenarios stay the same)")
    ap.add_argument("--resume", action="store_true", default=None,
                    help="continue from the model's last checkpoint (default: start fresh, earlier ones moved aside)")
    a = ap.parse_args(argv)
    cfg = tomllib.loads(a.config.read_text())
    for key in ("steps", "base_model", "group_size", "scenarios_per_step", "eval_games", "out", "resume", "seed"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    return cfg


async def evaluate(rollout: art.Rollout, scenarios: list[Any], rewards: list[Any],
                   success: Callable[[art.Trajectory], bool] | None = None) -> tuple[float, float | None]:
    """(mean reward, share of scenarios that ``success`` counts as solved) on held-out scenarios.
    A rollout that takes a ``temperature`` answers greedily here, so before and after compare
    the model's best answers, not samples."""
    if "temperature" in rollout.signature.parameters:
        scenarios = [art.Args(s, temperature=0.0) for s in scenarios]
    groups = await art.gather(rollout, scenarios, group_size=1, rewards=rewards)
    trajs = [t for g in groups for t in g]
    scored = [t.reward for t in trajs if t.reward is not None]
    mean = sum(scored) / len(scored) if scored else float("nan")
    rate = sum(1 for t in trajs if t.error is None and success(t)) / len(trajs) if success and trajs else None
    return mean, rate


def start_fresh(project: str, name: str) -> None:
    """Move the model's earlier checkpoints (local backend) aside, loudly, so this run starts
    from the base model; nothing is deleted."""
    folder = Path(art.settings().home) / project / name / "checkpoints"
    steps = [p for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    if not steps:
        return
    kept = folder.with_name(f"checkpoints.{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(kept)
    print(f"starting fresh: the {len(steps)} checkpoint(s) of an earlier run were moved to {kept} "
          f"(run with --resume to continue from them instead)", flush=True)


async def train(cfg: dict[str, Any], rollout: art.Rollout, rewards: list[Any],
                make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]],
                success: Callable[[art.Trajectory], bool] | None = None) -> dict[str, Any]:
    art.configure(project=cfg["project"])
    train_settings = {k: cfg[k] for k in ("learning_rate", "loss", "seed") if k in cfg}
    model = art.TrainableModel(cfg["model"], base_model=cfg["base_model"], project=cfg["project"],
                               config={"train": train_settings})
    t0 = time.monotonic()
    print(f"{cfg['project']}: training {model.name} from {model.base_model} "
          f"({art.settings().backend} backend, store {art.settings().store_url})", flush=True)
    if not cfg.get("resume") and art.settings().backend == "local":
        start_fresh(model.project, model.name)
    async with art.session(model) as run:
        if run.step:
            print(f"resuming from step {run.step} of an earlier run", flush=True)
        held_out = make_scenarios(cfg.get("eval_games", 16), 10_000, cfg)
        before, rate_before = await evaluate(rollout, held_out, rewards, success)
        print(f"eval before: mean reward {before:.3f} over {len(held_out)} games"
              + (f", solved {rate_before:.0%}" if rate_before is not None else ""), flush=True)
        history = []
        for step in range(cfg["steps"]):
            seed = step + 1000 * cfg.get("seed", 0)
            groups = await art.gather(rollout, make_scenarios(cfg["scenarios_per_step"], seed, cfg),
                                      group_size=cfg["group_size"], rewards=rewards)
            mean = sum(t.reward for g in groups for t in g.scored) / max(1, sum(len(g.scored) for g in groups))
            result = await run.train(groups)
            m = result.metrics
            history.append({"step": step + 1, "model_step": result.step, "reward": mean, **m})
            print(f"step {step + 1}: reward {mean:.3f}  loss {m.get('loss', 0):+.4f}  "
                  f"groups trained {result.groups_trained} skipped {result.groups_skipped}  "
                  f"tokens {int(m.get('tokens_trained', 0))}  {m.get('seconds', 0):.1f}s"
                  + ("" if result.trained else "  (nothing to learn from: no weight moved)"), flush=True)
        after, rate_after = await evaluate(rollout, held_out, rewards, success)
        print(f"eval after {cfg['steps']} steps: mean reward {after:.3f} over {len(held_out)} games"
              + (f", solved {rate_after:.0%}" if rate_after is not None else "")
              + f" (before {before:.3f}); {time.monotonic() - t0:.0f}s in all", flush=True)
        final_step = run.step
    where_next(model, final_step)
    return {"before": before, "after": after, "solved_before": rate_before, "solved_after": rate_after,
            "eval_scenarios": len(held_out), "history": history}


def where_next(model: art.TrainableModel, step: int) -> None:
    """Say where the run left its results and what to try next."""
    import os

    s = art.settings()
    cli = Path(sys.executable).with_name("artsdk")  # in the virtual environment, maybe not on PATH
    artsdk = os.path.relpath(cli) if cli.is_file() else "artsdk"
    lines = [f"\nthe model is at step {step}."]
    if s.backend == "local":
        lines.append(f"  checkpoints (LoRA adapters, peft format): {Path(s.home).resolve() / model.project / model.name / 'checkpoints'}")
    lines += [f"  trajectories and steps: {s.store_url}",
              "next:",
              f"  {artsdk} trajectories list --project {model.project}    # the newest rollouts, rewards, errors",
              f"  {artsdk} trajectories show <id>                     # one conversation, call by call",
              f"  {artsdk} view                                       # reward curve, groups, chats, comparisons in a browser",
              "  run this command again to start fresh, or with --resume to continue training"]
    print("\n".join(lines), flush=True)


def main(config_path: Path, rollout: art.Rollout, rewards: list[Any],
         make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]], argv: Sequence[str] | None = None,
         rewards_for: Callable[[dict[str, Any]], list[Any]] | None = None,
         success: Callable[[art.Trajectory], bool] | None = None) -> None:
    """Run an example from the command line; ``rewards_for(config)`` may pick the rewards
    from the config (an optional LLM judge, say)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = load_config(config_path, argv if argv is not None else sys.argv[1:])
    if rewards_for is not None:
        rewards = rewards_for(cfg)
    try:
        result = asyncio.run(train(cfg, rollout, rewards, make_scenarios, success))
    except KeyboardInterrupt:
        print("\ninterrupted: rollouts in flight were stored as interrupted, and every finished step is "
              "in its checkpoint. Run again with --resume to continue, or without to start fresh.",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    if cfg.get("out"):
        import json

        out = Path(cfg["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        command = "python -m " + rollout.fn.__module__.rsplit(".", 1)[0] + ".train " + " ".join(
            argv if argv is not None else sys.argv[1:])
        out.write_text(json.dumps({**result, "config": {k: v for k, v in cfg.items() if k != "out"},
                                   "command": command.strip()}, indent=2, default=str))
