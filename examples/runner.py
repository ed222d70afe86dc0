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
                    help="finish the model's last run from its last checkpoint (default: a new run from the base "
                         "model, earlier checkpoints moved aside)")
    a = ap.parse_args(argv)
    cfg = tomllib.loads(a.config.read_text())
    for key in ("steps", "base_model", "group_size", "scenarios_per_step", "eval_games", "out", "resume", "seed"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    return cfg


async def evaluate(rollout: art.Rollout, scenarios: list[Any], rewards: list[Any],
                   success: Callable[[art.Trajectory], bool] | None = None
                   ) -> tuple[float, float | None, list[art.Trajectory]]:
    """(mean reward, share of scenarios that ``success`` counts as solved, the trajectories) on
    held-out scenarios. A rollout that takes a ``temperature`` answers greedily here, so before
    and after compare the model's best answers, not samples."""
    if "temperature" in rollout.signature.parameters:
        scenarios = [art.Args(s, temperature=0.0) for s in scenarios]
    groups = await art.gather(rollout, scenarios, group_size=1, rewards=rewards)
    trajs = [t for g in groups for t in g]
    scored = [t.reward for t in trajs if t.reward is not None]
    mean = sum(scored) / len(scored) if scored else float("nan")
    rate = sum(1 for t in trajs if t.error is None and success(t)) / len(trajs) if success and trajs else None
    return mean, rate, trajs


def show(label: str, trajs: list[art.Trajectory], n: int = 3) -> None:
    """A few answers, so a figure can be understood."""
    for t in trajs[:n]:
        answer = (t.last_message or {}).get("content") or t.outcome
        print(f"  {label}: {str(answer)[:100]!r} (reward {t.reward if t.reward is None else round(t.reward, 3)})",
              flush=True)


async def train(cfg: dict[str, Any], rollout: art.Rollout, rewards: list[Any],
                make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]],
                success: Callable[[art.Trajectory], bool] | None = None) -> dict[str, Any]:
    art.configure(project=cfg["project"])
    train_settings = {k: cfg[k] for k in ("learning_rate", "loss", "seed", "minibatches", "epochs") if k in cfg}
    model = art.TrainableModel(cfg["model"], base_model=cfg["base_model"], project=cfg["project"],
                               config={"train": train_settings})
    noun = cfg.get("noun", "scenarios")  # what one held-out scenario is called: games, reviews, puzzles
    t0 = time.monotonic()
    print(f"{cfg['project']}: training {model.name} from {model.base_model} "
          f"({art.settings().backend} backend, store {art.settings().store_url}); loading the model...", flush=True)
    async with art.session(model, resume=bool(cfg.get("resume"))) as run:
        if run.endpoint.moved_aside:
            print(f"starting fresh: the checkpoints of an earlier run were moved to {run.endpoint.moved_aside} "
                  f"(run with --resume to continue from them instead)", flush=True)
        print(f"run {run.run_id}" + (f", resumed at step {run.step}" if run.resumed else ", from the base model"),
              flush=True)
        held_out = make_scenarios(cfg.get("eval_games", 16), 10_000, cfg)
        if run.resumed and "eval_before" in run.meta:  # evaluated when the run began
            before, rate_before = run.meta["eval_before"], run.meta.get("solved_before")
            print(f"eval before (when the run began): mean reward {before:.3f} over {len(held_out)} {noun}"
                  + (f", solved {rate_before:.0%}" if rate_before is not None else ""), flush=True)
        else:
            print(f"evaluating on {len(held_out)} held-out {noun}, greedily...", flush=True)
            before, rate_before, trajs = await evaluate(rollout, held_out, rewards, success)
            print(f"eval before: mean reward {before:.3f} over {len(held_out)} {noun}"
                  + (f", solved {rate_before:.0%}" if rate_before is not None else ""), flush=True)
            show("before", trajs)
            await run.remember(eval_before=before, solved_before=rate_before)
        history = []
        start = run.step
        for i in range(max(cfg["steps"] - start, 0)):  # --resume finishes the run's steps, no more
            seed = start + i + 1000 * cfg.get("seed", 0)
            print(f"step {run.step + 1}: gathering {cfg['scenarios_per_step']} x {cfg['group_size']} rollouts...",
                  flush=True)
            groups = await art.gather(rollout, make_scenarios(cfg["scenarios_per_step"], seed, cfg),
                                      group_size=cfg["group_size"], rewards=rewards)
            mean = sum(t.reward for g in groups for t in g.scored) / max(1, sum(len(g.scored) for g in groups))
            label = run.step + 1
            result = await run.train(groups)
            m = result.metrics
            history.append({"step": result.step, "reward": mean, **m})
            print(f"step {label}: reward {mean:.3f}  loss {m.get('loss', 0):+.4f}  "
                  f"groups trained {result.groups_trained} skipped {result.groups_skipped}  "
                  f"tokens {int(m.get('tokens_trained', 0))}  {m.get('seconds', 0):.1f}s"
                  + ("" if result.trained else f"  (nothing to learn from: no weight moved, the model stays at step "
                                               f"{result.step})"), flush=True)
        after, rate_after, trajs = await evaluate(rollout, held_out, rewards, success)
        print(f"eval after {len(history)} steps (the model at step {run.step}): mean reward {after:.3f} over "
              f"{len(held_out)} {noun}"
              + (f", solved {rate_after:.0%}" if rate_after is not None else "")
              + f" (before {before:.3f}); {time.monotonic() - t0:.0f}s in all", flush=True)
        show("after", trajs)
        final_step, run_id = run.step, run.run_id
    where_next(model, final_step)
    return {"before": before, "after": after, "solved_before": rate_before, "solved_after": rate_after,
            "eval_scenarios": len(held_out), "history": history, "run": run_id}


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
              "  run this command again to start a new run, or with --resume to finish this one"]
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
