"""docs/examples.md from bench/results/example_<name>.json: each example's held-out results
before and after training, on every seed, each mean with its standard error over the held-out
scenarios and each gain paired on the same scenarios (bench/stats.py), beside the baselines'
expected values and, where an example has a warm-up, a control that spends GRPO's steps on
more supervision instead."""

from __future__ import annotations

from typing import Any, Optional

from bench.common import DOCS, load_result as load
from bench.stats import fmt, fmt_gain, mean_se, paired

# per example: title, what it is, what "solved" counts, its rewards, a GPU recipe (not yet run here)
EXAMPLES = {
    "reviews": ("Review labeller (the demo)",
                "A short product review in, one word out (positive or negative): the README's demo.",
                "exactly the right label, nothing else",
                "1 for the right label alone, less for the right label inside a sentence, 0 otherwise",
                'base_model = "Qwen/Qwen2.5-3B-Instruct"\nbackend_options = {device = "cuda"}\nsteps = 20'),
    "tic_tac_toe": ("Tic-tac-toe",
                    "The model plays X against an opponent that wins when it can and blocks when it must, one "
                    "move per call, shown the board, the free cells and, spelled out, any cell where it wins "
                    "now or where O would win next. It first warms up on a demonstrator's games (a random "
                    "legal cell each move: legal play, no tactics).",
                    "won",
                    "win 1, draw 0.5, loss 0, an illegal or unreadable move -0.5 (and the game ends); "
                    "+0.02 a legal move; + 0.25 x the share of chances taken (a win there to take, else a "
                    "loss to block), a credit per move",
                    'base_model = "Qwen/Qwen2.5-3B-Instruct"\nbackend_options = {device = "cuda"}\n'
                    'steps = 50\nscenarios_per_step = 16\ngroup_size = 8'),
    "game_2048": ("2048",
                  "The model plays 2048, one direction per call, shown the board and, spelled out, which "
                  "moves merge tiles and which only slide them. It first warms up on a demonstrator's games "
                  "(a random move that changes the board: legal play, no plan).",
                  "every move readable and moving something, to the turn limit or the game's end",
                  "log2(largest tile)/11 + 0.5 x log-scaled board total; -0.5 for an unreadable or useless move "
                  "(the game ends); + 0.1 x the share of turns that merged tiles where a move could, a credit "
                  "per move",
                  'base_model = "Qwen/Qwen2.5-7B-Instruct"\nbackend_options = {device = "cuda", engine = "vllm"}\n'
                  'turns = 200\nsteps = 60\nscenarios_per_step = 16\ngroup_size = 8'),
    "temporal_clue": ("Temporal Clue",
                      "A murder puzzle of clues about who, with what, where and when; the model answers four lines.",
                      "all four answers right",
                      "the fraction of who / weapon / room / time right, + 0.2 x the fraction of the four answer "
                      "lines present",
                      'base_model = "Qwen/Qwen2.5-7B-Instruct"\nbackend_options = {device = "cuda", engine = "vllm"}\n'
                      'size = 5\nsteps = 60\nscenarios_per_step = 16\ngroup_size = 8'),
    "email_agent": ("Email research agent",
                    "A question about an inbox of 3,000 emails; the model searches (full text), reads emails "
                    "and answers with its sources, through tool calls, over up to six turns. The held-out "
                    "questions are never trained on, in the warm-up or after.",
                    "the right answer",
                    "1 for the right answer citing its email (0.7 without), 0 for \"I don't know\", -0.5 for a "
                    "wrong answer; +0.1 each for finding and reading the right email, +0.1 for a well-formed "
                    "tool call, -0.02 a turn past the third (and, with `judge_model` set, a judge's score x 0.5)",
                    'base_model = "Qwen/Qwen2.5-7B-Instruct"\nbackend_options = {device = "cuda", engine = "vllm"}\n'
                    'warmup = 0   # a 7B model calls tools on its own\nsteps = 40\nscenarios_per_step = 12\n'
                    'group_size = 8\n# judge_model = "gpt-4o-mini"'),
}


def _seed_command(key: str, command: str) -> str:
    """A seed's command as a user runs it from any folder (the venv's artsdk), seed N."""
    import re

    args = re.sub(r" --seed \d+", " --seed N", command.replace(f"python -m examples.{key}.train", "", 1))
    return f".venv/bin/artsdk train examples/{key}{args}"




def _pct(values: list) -> str:
    values = [v for v in values if v is not None]
    return "-" if not values else " / ".join(f"{v:.0%}" for v in values)


def _rewards(run: dict[str, Any], when: str) -> Optional[list]:
    """A run's reward on each held-out scenario at ``when`` (before, warmup, after)."""
    return ((run.get("each") or {}).get(when) or {}).get("rewards")


def _cell(run: dict[str, Any], when: str, mean_key: str) -> str:
    each = _rewards(run, when)
    if each is not None:
        m, se, _ = mean_se(each)
        return fmt(m, se)
    m = run.get(mean_key)
    return "-" if m is None else f"{m:.3f}"


def _gain(run: dict[str, Any], a: str, b: str, other: Optional[dict[str, Any]] = None) -> str:
    """``b - a`` of one run (or ``b`` of ``other`` minus ``a`` of this run), paired."""
    x, y = _rewards(run, a), _rewards(other if other is not None else run, b)
    return fmt_gain(paired(x, y)) if x is not None and y is not None and len(x) == len(y) else "-"


def _baseline_cell(b: dict[str, Any]) -> str:
    if "draws" in b:
        return f"{b['reward']:.3f} (expected over {b['draws']} draws; one draw: sd {b['spread']:.3f})"
    return fmt(b["reward"], b.get("se", float("nan")))


def example_section(key: str, r: Optional[dict]) -> list[str]:
    title, what, solved, rewards, gpu = EXAMPLES[key]
    out = [f"## {title}", "", what, "", f"Reward: {rewards}. Solved: {solved}.", ""]
    runs = (r or {}).get("runs") or []
    if not runs:
        return out + [f"Not measured yet: `.venv/bin/python -m bench.examples {key}`.", ""]
    cfg = r["config"]
    controls = {c["seed"]: c for c in r.get("controls", [])}
    seeds = [x["seed"] for x in runs]
    grpo = cfg["steps"]
    knobs = {k: cfg[k] for k in ("turns", "size", "opponent", "temperature", "warmup") if k in cfg}
    n = runs[0].get("eval_scenarios", cfg.get("eval_games", 16))
    out += [f"On the CPU ({r['machine']}): {grpo} GRPO steps of {cfg['scenarios_per_step']} scenarios x "
            f"{cfg['group_size']} rollouts"
            + (f" after a supervised warm-up on {cfg['warmup']} scenarios' scripted conversations"
               if cfg.get("warmup") else "")
            + f", {n} held-out scenarios "
            + (f"played once each at temperature {cfg['eval_temperature']}" if cfg.get("eval_temperature")
               else "answered greedily")
            + (f"; difficulty: {', '.join(f'{k} = {v!r}' for k, v in knobs.items() if k != 'warmup')}"
               if set(knobs) - {"warmup"} else "")
            + f". Seeds {', '.join(map(str, seeds))}; a run took {sum(x['seconds'] for x in runs) / len(runs) / 60:.0f} "
              f"minutes on average (at most {max(x['seconds'] for x in runs) / 60:.0f}), evaluations included.", "",
            *([r["note"], ""] if r.get("note") else []),
            f"Mean held-out reward ± its standard error over the {n} scenarios:", "",
            "| held out | " + " | ".join(f"seed {s}" for s in seeds) + " | solved |",
            "|---|" + "---|" * len(seeds) + "---|",
            f"| {r['base_model'].split('/')[-1]}, untrained | "
            + " | ".join(_cell(x, "before", "before") for x in runs)
            + f" | {_pct([x.get('solved_before') for x in runs])} |"]
    if any("after_warmup" in x for x in runs):
        out.append("| after the SFT warm-up | " + " | ".join(_cell(x, "warmup", "after_warmup") for x in runs)
                   + f" | {_pct([x.get('solved_after_warmup') for x in runs])} |")
    if controls:
        out.append(f"| control: warm-up + {grpo} supervised steps on the scripted answers | "
                   + " | ".join(_cell(controls[s], "after", "after") if s in controls else "-" for s in seeds)
                   + f" | {_pct([controls[s].get('solved_after') for s in seeds if s in controls])} |")
    out.append(f"| **trained** ({'warm-up + ' if cfg.get('warmup') else ''}{grpo} GRPO steps) | "
               + " | ".join(f"**{_cell(x, 'after', 'after')}**" for x in runs)
               + f" | {_pct([x.get('solved_after') for x in runs])} |")
    piped = {p["seed"]: p for p in r.get("pipelined", [])}
    if piped:
        lag = next(iter(piped.values()))["config"].get("max_policy_lag")
        out.append(f"| trained pipelined (`run.loop`, max_policy_lag {lag}) | "
                   + " | ".join(_cell(piped[s], "after", "after") if s in piped else "-" for s in seeds)
                   + f" | {_pct([piped[s].get('solved_after') for s in seeds if s in piped])} |")
    out += ["", "Baselines on the same scenarios and rewards (a random one as its expected value):", "",
            "| baseline | mean reward | solved |", "|---|---|---|"]
    for label, b in r.get("baselines", {}).items():
        out.append(f"| {label} | {_baseline_cell(b)} | {_pct([b.get('solved')])} |")
    gains = ["", "Gains, paired on the same held-out scenarios (± a standard error; \"within noise\" below two):", "",
             "| gain | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds),
             "| trained − untrained | " + " | ".join(_gain(x, "before", "after") for x in runs) + " |"]
    if any("after_warmup" in x for x in runs):
        gains += ["| the warm-up (after it − untrained) | " + " | ".join(_gain(x, "before", "warmup") for x in runs)
                  + " |",
                  "| GRPO after the warm-up (trained − after it) | "
                  + " | ".join(_gain(x, "warmup", "after") for x in runs) + " |"]
    if piped:
        gains.append("| pipelined − sequential (the same steps, gathered while training) | "
                     + " | ".join(_gain(x, "after", "after", piped[x["seed"]]) if x["seed"] in piped else "-"
                                  for x in runs) + " |")
    if controls:
        gains.append("| **GRPO over its control** (trained − control) | "
                     + " | ".join(f"**{_gain(controls[x['seed']], 'after', 'after', x)}**" if x["seed"] in controls
                                  else "-" for x in runs) + " |")
    for label, b in r.get("baselines", {}).items():
        if b.get("each") is not None:
            base = {"each": {"baseline": {"rewards": b["each"]}}}
            gains.append(f"| trained − {label} | " + " | ".join(_gain(base, "baseline", "after", x) for x in runs)
                         + " |")
    out += gains
    out += ["", f"![{title}: reward by step](img/example_{key}.png)", "",
            f"Reproduce, in the clone: `.venv/bin/{r['command']}`"
            + (f" and `.venv/bin/{r['control_command']}`" if r.get("control_command") else "")
            + (f" and `.venv/bin/{r['pipelined_command']}`" if r.get("pipelined_command") else "")
            + f". Each seed is `{_seed_command(key, runs[0]['command'])}`, which the benchmark runs in an empty "
              "folder of its own (its own store and checkpoints).", "",
            "On a GPU (a recipe, not yet run here): in the example's config.toml,", "", "```toml", gpu, "```", ""]
    return out


def examples_page() -> None:
    lines = ["# Examples: do they learn?", "",
             "Each example is plain agent code (`examples/<name>/agent.py`) with its rewards, trained by",
             "`.venv/bin/artsdk train examples/<name>` (or `make ttt`, `make 2048`, `make clue`, `make email`,",
             "`make reviews`; in the activated venv, `python -m examples.<name>.train`) from its `config.toml`.",
             "Below, each one trained from the embedded SmolLM2-135M-Instruct on the CPU, from scratch on two",
             "seeds, in the minutes its section gives. The held-out scenarios are never trained on, whatever the",
             "seed (training, warm-up and held-out scenarios come from separate streams: examples/streams.py);",
             "they are answered greedily (or, where a section says so, played once each at its config's",
             "`eval_temperature`) before, after any warm-up, and at the end. Every mean carries its standard",
             "error over those scenarios, every gain is paired on them (the same scenario before and after)",
             "and is marked \"within noise\" when under two standard errors; baselines are scored by the same",
             "rewards, a random one as its expected value over many draws. Where an example has a warm-up, a",
             "control run spends GRPO's steps on supervised training on the scripted answers to the same",
             "scenarios, so the table shows what reinforcement added beyond more supervision.",
             "`python -m bench.examples <name>` produced every table and picture here; `--model-url URL",
             "--model NAME` adds any OpenAI-compatible model as one more row.", "",
             "What to expect of a 135M model on a CPU: it learns formats, legal moves and short exact",
             "answers within minutes, and a tool-calling routine once shown a few conversations. Beyond a",
             "demonstrator it goes where the observation spells out what matters (tic-tac-toe's threats,",
             "2048's merging moves), on both seeds; tic-tac-toe held on both only once each step trained on",
             "groups that differ (dynamic sampling). Where a demonstrator already solves the task (the email",
             "agent's), imitating it beats reinforcement at this scale; the section says why. Each config's",
             "difficulty knobs (turns, puzzle size, the warm-up) are set for the CPU; the GPU recipes keep",
             "the full tasks.", ""]
    for key in EXAMPLES:
        lines += example_section(key, load(f"example_{key}"))
    (DOCS / "examples.md").write_text("\n".join(lines))
