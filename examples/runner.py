"""The training loop every example shares: evaluate, train for some steps, evaluate again.

    python -m examples.tic_tac_toe.train [--steps 5] [--base-model tiny] [--config FILE]

Settings come from the example's config.toml; the backend (local by default, or remote) and
the store come from the usual artsdk settings, so ``ARTSDK_BACKEND=remote`` switches it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import artsdk as art

from . import streams
from .streams import HELD_OUT  # noqa: F401 - where the examples' own modules look for it


def load_config(path: Path, argv: Sequence[str] | None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=path)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--base-model")
    ap.add_argument("--group-size", type=int)
    ap.add_argument("--scenarios-per-step", type=int)
    ap.add_argument("--eval-games", type=int)
    ap.add_argument("--eval-every", type=int, help="also evaluate the held-out scenarios every N steps")
    ap.add_argument("--warmup", type=int, help="how many good conversations to warm up on (0: none), "
                                               "where the example has them")
    ap.add_argument("--out", type=Path, help="write the figures (eval before/after, each step) here as JSON")
    ap.add_argument("--seed", type=int, help="seed of the training scenarios and the adapter's initialisation "
                                              "(the held-out scenarios stay the same)")
    ap.add_argument("--resume", action="store_true", default=None,
                    help="finish the model's last run from its last checkpoint (default: a new run from the base "
                         "model, earlier checkpoints moved aside)")
    ap.add_argument("--max-policy-lag", type=int, help="gather the next steps' rollouts while a step trains "
                                                        "(run.loop), no trained token more than this many steps old")
    ap.add_argument("--dynamic-sampling", type=float, help="draw up to this many times scenarios_per_step "
                                                            "scenarios a step until that many groups have rewards "
                                                            "that differ (DAPO's dynamic sampling; 0: off)")
    ap.add_argument("--control", choices=["sft"], help="instead of GRPO, train each step supervised on the "
                                                       "scripted answers to the same scenarios (what GRPO adds is "
                                                       "measured against this), where the example has them")
    a = ap.parse_args(argv)
    cfg = tomllib.loads(a.config.read_text())
    for key in ("steps", "base_model", "group_size", "scenarios_per_step", "eval_games", "eval_every", "warmup", "out",
                "resume", "seed", "control", "max_policy_lag", "dynamic_sampling"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    return cfg


async def evaluate(rollout: art.Rollout, scenarios: list[Any], rewards: list[Any],
                   success: Callable[[art.Trajectory], bool] | None = None, temperature: float = 0.0,
                   run: Optional[art.Session] = None) -> tuple[float, float | None, list[art.Trajectory]]:
    """(mean reward, share of scenarios that ``success`` counts as solved, the trajectories) on
    held-out scenarios. A rollout that takes a ``temperature`` answers greedily here by default,
    so before and after compare the model's best answers, not samples; a config's
    ``eval_temperature`` plays each scenario once at that temperature instead (for a task where
    the greedy answer repeats one move until it fails, as 2048's does). In a training ``run``, it
    is that run's evaluation (``run.evaluate``: filed with the step, the viewer's held-out curve);
    without one (a model behind a URL, bench/examples.py), a plain gather."""
    calls = at_temperature(rollout, scenarios, temperature)
    if run is not None:
        trajs = (await run.evaluate(rollout, calls, rewards=rewards, name="held-out")).trajectories
    else:
        trajs = [t for g in await art.gather(rollout, calls, group_size=1, rewards=rewards) for t in g]
    scored = [t.reward for t in trajs if t.reward is not None]
    mean = sum(scored) / len(scored) if scored else float("nan")
    rate = sum(1 for t in trajs if t.error is None and success(t)) / len(trajs) if success and trajs else None
    return mean, rate, trajs


def at_temperature(rollout: art.Rollout, scenarios: list[Any], temperature: Optional[float]) -> list[Any]:
    """The scenarios, each asking a rollout that takes a ``temperature`` to sample at this one
    (None: the rollout's own default)."""
    if temperature is None or "temperature" not in rollout.signature.parameters:
        return scenarios
    return [art.Args(*s.args, **{**s.kwargs, "temperature": temperature}) if isinstance(s, art.Args)
            else art.Args(s, temperature=temperature) for s in scenarios]


def each(trajs: list[art.Trajectory], success: Callable[[art.Trajectory], bool] | None) -> dict[str, list[Any]]:
    """Per held-out scenario, in order: its reward (None: the rollout failed) and whether it was
    solved -- what paired differences and standard errors are computed from (bench.stats)."""
    return {"rewards": [t.reward for t in trajs],
            "solved": [t.error is None and bool(success(t)) for t in trajs] if success else None}


def show(label: str, trajs: list[art.Trajectory], n: int = 3) -> None:
    """A few answers, so a figure can be understood."""
    for t in trajs[:n]:
        answer = (t.last_message or {}).get("content") or t.outcome
        print(f"  {label}: {str(answer)[:100]!r} (reward {t.reward if t.reward is None else round(t.reward, 3)})",
              flush=True)


async def train(cfg: dict[str, Any], rollout: art.Rollout, rewards: list[Any],
                make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]],
                success: Callable[[art.Trajectory], bool] | None = None,
                warmup: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
                scripted: Callable[[list[Any], dict[str, Any]], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
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
        held_out = streams.held_out(make_scenarios, cfg)
        control = cfg.get("control")
        if control and scripted is None:
            raise SystemExit("--control sft needs an example with scripted answers (scripted in its train.py)")
        eval_t = cfg.get("eval_temperature", 0.0)
        how = f"once each at temperature {eval_t}" if eval_t else "greedily"
        per: dict[str, Any] = {}  # per-scenario figures of each evaluation
        if run.resumed and "eval_before" in run.meta:  # evaluated when the run began
            before, rate_before = run.meta["eval_before"], run.meta.get("solved_before")
            per["before"] = run.meta.get("each_before")
            print(f"eval before (when the run began): mean reward {before:.3f} over {len(held_out)} {noun}"
                  + (f", solved {rate_before:.0%}" if rate_before is not None else ""), flush=True)
        else:
            print(f"evaluating on {len(held_out)} held-out {noun}, {how}...", flush=True)
            before, rate_before, trajs = await evaluate(rollout, held_out, rewards, success, eval_t, run)
            per["before"] = each(trajs, success)
            print(f"eval before: mean reward {before:.3f} over {len(held_out)} {noun}"
                  + (f", solved {rate_before:.0%}" if rate_before is not None else ""), flush=True)
            show("before", trajs)
            await run.remember(eval_before=before, solved_before=rate_before, each_before=per["before"])
        history, evals = [], []
        if warmup is not None and cfg.get("warmup") and not run.step:  # a supervised warm-up first
            examples = warmup(cfg)
            print(f"warm-up: supervised on {len(examples)} good conversations...", flush=True)
            sft = await run.train_sft(examples, **cfg.get("sft", {}))
            history.append({"step": sft.step, "sft": True, **sft.metrics})
            print(f"step {sft.step} (warm-up): loss {sft.metrics['loss_first_epoch']:.3f} -> {sft.metrics['loss']:.3f} "
                  f"over {int(sft.metrics['examples'])} conversations, {sft.metrics['seconds']:.1f}s", flush=True)
            mean, rate, trajs = await evaluate(rollout, held_out, rewards, success, eval_t, run)
            per["warmup"] = each(trajs, success)
            evals.append({"step": sft.step, "reward": mean, "solved": rate, "warmup": True})
            print(f"eval after the warm-up: mean reward {mean:.3f}" + (f", solved {rate:.0%}" if rate is not None else ""),
                  flush=True)
            show("warmed up", trajs)
            await run.remember(warmup_steps=1, eval_warmup=mean, solved_warmup=rate, each_warmup=per["warmup"])
        start = run.step
        target = cfg["steps"] + run.meta.get("warmup_steps", 0)  # GRPO steps, after any warm-up
        lag = cfg.get("max_policy_lag")  # set: gathering goes on while steps train (run.loop)
        if lag is not None and not control and target > start:
            history += await pipelined(run, cfg, rollout, rewards, make_scenarios, held_out, target - start, lag)
        for i in range(max(target - start, 0) if lag is None or control else 0):  # --resume finishes the run's steps
            drawn = streams.training(make_scenarios, cfg["scenarios_per_step"], cfg.get("seed", 0), start + i, cfg,
                                     held_out)  # never a held-out scenario, whatever the seed
            if control:  # the control: the same scenarios, trained on their scripted answers
                sft = await run.train_sft(scripted(drawn, cfg), **cfg.get("sft", {}))
                history.append({"step": sft.step, "sft": True, "control": True, **sft.metrics})
                print(f"step {sft.step} (control, supervised on {len(drawn)} scripted answers): loss "
                      f"{sft.metrics['loss']:.3f}, {sft.metrics['seconds']:.1f}s", flush=True)
                every = cfg.get("eval_every", 0)
                if every and (i + 1) % every == 0 and i + 1 < target - start:
                    mean, rate, _ = await evaluate(rollout, held_out, rewards, success, eval_t, run)
                    evals.append({"step": run.step, "reward": mean, "solved": rate})
                continue
            print(f"step {run.step + 1}: gathering {cfg['scenarios_per_step']} x {cfg['group_size']} rollouts...",
                  flush=True)
            groups, sampled = await gathered(cfg, rollout, rewards, make_scenarios, held_out, start + i, drawn)
            mean = sum(t.reward for g in groups for t in g.scored) / max(1, sum(len(g.scored) for g in groups))
            label = run.step + 1
            result = await run.train(groups)
            history.append({"step": result.step, "reward": mean, **sampled, **result.metrics})
            print_step(label, mean, result, f"  ({sampled['scenarios_drawn']} scenarios drawn, "
                                            f"{sampled['groups_dropped']} tied groups dropped)" if sampled else "")
            every = cfg.get("eval_every", 0)
            if every and (i + 1) % every == 0 and i + 1 < target - start:  # the held-out curve, on the way
                mean, rate, _ = await evaluate(rollout, held_out, rewards, success, eval_t, run)
                evals.append({"step": run.step, "reward": mean, "solved": rate})
                print(f"eval at step {run.step}: mean reward {mean:.3f}" + (f", solved {rate:.0%}" if rate is not None
                                                                           else ""), flush=True)
        after, rate_after, trajs = await evaluate(rollout, held_out, rewards, success, eval_t, run)
        per["after"] = each(trajs, success)
        print(f"eval after {len(history)} steps (the model at step {run.step}): mean reward {after:.3f} over "
              f"{len(held_out)} {noun}"
              + (f", solved {rate_after:.0%}" if rate_after is not None else "")
              + f" (before {before:.3f}); {time.monotonic() - t0:.0f}s in all", flush=True)
        show("after", trajs)
        final_step, run_id, meta = run.step, run.run_id, dict(run.meta)
    where_next(model, final_step)
    warm = {"after_warmup": meta["eval_warmup"], "solved_after_warmup": meta.get("solved_warmup")} \
        if "eval_warmup" in meta else {}
    per.setdefault("warmup", meta.get("each_warmup"))
    evals.append({"step": final_step, "reward": after, "solved": rate_after})
    return {"before": before, "after": after, "solved_before": rate_before, "solved_after": rate_after, **warm,
            "eval_scenarios": len(held_out), "history": history, "evals": evals, "run": run_id,
            "each": {k: v for k, v in per.items() if v is not None}, "control": control}


async def gathered(cfg: dict[str, Any], rollout: art.Rollout, rewards: list[Any], make_scenarios: Callable,
                   held_out: list[Any], step: int, drawn: list[Any]) -> tuple[list[art.Group], dict[str, int]]:
    """A GRPO step's groups. With the config's ``dynamic_sampling`` (DAPO's), scenarios are
    drawn on from the step's own stream (``drawn`` first, then the ones after it, up to
    ``dynamic_sampling`` times as many) until ``scenarios_per_step`` groups have rewards that
    differ: a step where most games tie still trains on a full batch, not on the one or two
    groups left (whose update is as large and far noisier). The second value says what it took."""
    times, n = cfg.get("dynamic_sampling", 0), cfg["scenarios_per_step"]
    if not times or times <= 1:
        return await art.gather(rollout, at_temperature(rollout, drawn, cfg.get("temperature")),
                                group_size=cfg["group_size"], rewards=rewards), {}
    more = streams.training(make_scenarios, int(times * n), cfg.get("seed", 0), step, cfg, held_out)
    pool = drawn + [s for s in more if streams.key(s) not in {streams.key(d) for d in drawn}]
    got = await art.gather(rollout, at_temperature(rollout, pool, cfg.get("temperature")), group_size=cfg["group_size"],
                           rewards=rewards, signal_groups=n, max_scenarios=len(pool))
    return got, {"scenarios_drawn": got.drawn, "groups_dropped": got.dropped}


def print_step(label: int, mean: float, result: Any, extra: str = "") -> None:
    m = result.metrics
    print(f"step {label}: reward {mean:.3f}  loss {m.get('loss', 0):+.4f}  "
          f"groups trained {result.groups_trained} skipped {result.groups_skipped}  "
          f"tokens {int(m.get('tokens_trained', 0))}  {m.get('seconds', 0):.1f}s{extra}"
          + ("" if result.trained else f"  (nothing to learn from: no weight moved, the model stays at step "
                                       f"{result.step})"), flush=True)


async def pipelined(run: Any, cfg: dict[str, Any], rollout: art.Rollout, rewards: list[Any],
                    make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]], held_out: list[Any],
                    steps: int, lag: int) -> list[dict[str, Any]]:
    """The config's GRPO steps through ``run.loop``: the next step's rollouts are gathered while
    a step trains, no trained token more than ``lag`` steps old. The same scenarios as the
    sequential loop's, step for step (no evaluation on the way: only before and after)."""
    start = run.step

    n, times = cfg["scenarios_per_step"], cfg.get("dynamic_sampling", 0)
    dynamic = {"signal_groups": n, "max_scenarios": int(times * n)} if times and times > 1 else {}

    def scenarios() -> Any:  # with dynamic sampling, each step's stream is longer and read on as needed
        for i in range(steps):
            yield from at_temperature(rollout, streams.training(make_scenarios, dynamic.get("max_scenarios", n),
                                                                cfg.get("seed", 0), start + i, cfg, held_out),
                                      cfg.get("temperature"))

    print(f"steps {start + 1}-{start + steps}: gathering {cfg['scenarios_per_step']} x {cfg['group_size']} rollouts "
          f"a step while the steps before train (max_policy_lag {lag})...", flush=True)
    history = []
    label = start
    async for result in run.loop(rollout, scenarios(), group_size=cfg["group_size"], rewards=rewards, steps=steps,
                                 scenarios_per_step=n, max_policy_lag=lag, **dynamic):
        label += 1
        mean = result.metrics.get("reward_mean", float("nan"))
        history.append({"step": result.step, "reward": mean, **result.metrics})
        print_step(label, mean, result, f"  policy lag {result.metrics.get('policy_lag_max', 0):.0f}  trainer idle "
                                        f"{result.metrics.get('loop/trainer_idle_s', 0):.1f}s")
    return history


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


@dataclass
class Example:
    """What the runner (and ``bench.examples``) needs of an example: its config, agent, rewards,
    scenarios, what counts as solved, simple baselines to judge it against, and the
    conversations of an SFT warm-up when it has one."""

    name: str
    config: Path
    rollout: art.Rollout
    rewards: list[Any]
    make_scenarios: Callable[[int, int, dict[str, Any]], list[Any]]
    success: Callable[[art.Trajectory], bool] | None = None
    # (held-out scenarios, config, draw) -> {baseline name: the outcome its policy reaches on each};
    # ``draw`` seeds the baselines that choose at random (another draw, other choices)
    baselines: Callable[[list[Any], dict[str, Any], int], dict[str, list[Any]]] | None = None
    rewards_for: Callable[[dict[str, Any]], list[Any]] | None = None  # rewards chosen by the config
    warmup: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None  # SFT conversations
    # (scenarios, config) -> the scripted player's conversations on them: the --control sft run's data
    scripted: Callable[[list[Any], dict[str, Any]], list[dict[str, Any]]] | None = None
    # baselines that draw at random: their expected value is taken over many draws (bench.examples)
    random_baselines: frozenset[str] = frozenset()


def interruptible() -> None:
    """Ctrl-C (SIGINT) stops the run even when this process started with SIGINT ignored or
    blocked, as a child inherits them -- a background job of a script, a process a test
    runner's worker started: Python (and asyncio) put their handler in only where SIGINT is at
    its default, so such a run would ignore Ctrl-C and go on to its last step."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main(example: Example, argv: Sequence[str] | None = None) -> None:
    """Run an example from the command line."""
    interruptible()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = load_config(example.config, argv if argv is not None else sys.argv[1:])
    rewards = example.rewards_for(cfg) if example.rewards_for is not None else example.rewards
    try:
        result = asyncio.run(train(cfg, example.rollout, rewards, example.make_scenarios, example.success,
                                   warmup=example.warmup, scripted=example.scripted))
    except KeyboardInterrupt:
        print("\ninterrupted: rollouts in flight were stored as interrupted, and every finished step is "
              "in its checkpoint. Run again with --resume to continue, or without to start fresh.",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    if cfg.get("out"):
        import json

        out = Path(cfg["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        command = f"python -m examples.{example.name}.train " + " ".join(argv if argv is not None else sys.argv[1:])
        out.write_text(json.dumps({**result, "config": {k: v for k, v in cfg.items() if k != "out"},
                                   "command": command.strip()}, indent=2, default=str))
