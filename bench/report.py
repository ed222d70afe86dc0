"""Render docs/benchmarks.md from the JSON results in bench/results/.

    python -m bench.report
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def section_capture(r: dict) -> list[str]:
    out = ["## Capture overhead", "",
           "`python -m bench.capture`: the same chat calls to a scripted loopback server (its own",
           "process) with artsdk's patches removed and inside a rollout, in alternating blocks;",
           "median per-call time. Target: under 5% of the call and under 200 µs.", "",
           "| calls | uncaptured | captured | overhead | share of the call |", "|---|---|---|---|---|"]
    for row in r["rows"]:
        if "uncaptured_ms" in row:
            out.append(f"| {row['case']} | {row['uncaptured_ms']:.3f} ms | {row['captured_ms']:.3f} ms | "
                       f"{row['overhead_us']:+.0f} µs | {row['overhead_pct']:+.1f}% |")
        else:
            out.append(f"| {row['case']} | | | {row['overhead_us']:.1f} µs | |")
    out += ["", "Negative overheads are noise: the recording itself costs the last row's figure.",
            "For reference, OpenPipe ART's capture was measured at about 150 µs a call (370 µs",
            "streaming) on this kind of machine (not in this run).", ""]
    return out


def section_store(r: dict) -> list[str]:
    return ["## Trajectory store", "",
            f"`python -m bench.store`: {r['trajectories']:,} trajectories of {r['messages_each']} messages "
            "(with token ids, logprobs and two rewards each), written as `art.gather` writes them "
            "(a submission per group of 8) and read back as `Trajectory` objects, next to raw `sqlite3` "
            "`executemany` of the same, already serialized rows into the same schema and a raw read "
            "that only decodes the JSON columns. Target: at least 50% of the raw limit.", "",
            "| | artsdk | raw sqlite3 | ratio |", "|---|---|---|---|",
            f"| write | {r['artsdk_write_per_s']:,.0f} traj/s | {r['raw_write_per_s']:,.0f} traj/s | {r['write_ratio']:.2f} |",
            f"| read | {r['artsdk_read_per_s']:,.0f} traj/s | {r['raw_read_per_s']:,.0f} traj/s | {r['read_ratio']:.2f} |",
            ""]


def section_train(rs: list[dict]) -> list[str]:
    out = ["## Training throughput", "",
           "`python -m bench.train_throughput`: one GRPO step (CISPO loss) on groups of mixed-length",
           "trajectories next to a bare PyTorch forward + backward + optimizer step over the very same",
           "packed tokens on the same LoRA model (the limit), computing logits where artsdk does (only",
           "at trained tokens); and next to the same with logits at every position, as a plain",
           "causal-LM loss computes them. Target: at least 85% of the limit; padding waste under 10%.", "",
           "| model | tokens/step | artsdk | limit | ratio | full-logits fwd+bwd | ratio | step / with checkpoint | padding (packed / one row per trajectory) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        call = r.get("artsdk_call_seconds")
        full = r.get("bare_full_logits_tokens_per_s")
        out.append(f"| {r['model'].split('/')[-1]} | {r['tokens_per_step']:.0f} | {r['artsdk_tokens_per_s']:,.0f} tok/s | "
                   f"{r['bare_tokens_per_s']:,.0f} tok/s | {r['ratio']:.2f} | "
                   f"{'%s tok/s' % format(full, ',.0f') if full else '-'} | "
                   f"{'%.2f' % r['ratio_full_logits'] if full else '-'} | "
                   f"{r['artsdk_seconds']:.2f} s / {'%.2f s' % call if call else '-'} | "
                   f"0% / {100 * r['padding_waste_one_row_per_trajectory']:.0f}% |")
    return out + [""]


def section_inference(r: dict) -> list[str]:
    out = ["## Inference", "",
           f"`python -m bench.inference`: {r['model'].split('/')[-1]}, answers of exactly "
           f"{r['tokens_per_answer']} tokens; the server over HTTP against Hugging Face `generate` on the "
           "same batch in-process (the limit). Target at 16 concurrent: at least 70% of the limit and "
           "4x the single-request rate.", "",
           "| concurrent requests | server | HF generate | ratio |", "|---|---|---|---|"]
    for row in r["rows"]:
        out.append(f"| {row['concurrent']} | {row['server_tokens_per_s']:.1f} tok/s | "
                   f"{row['generate_tokens_per_s']:.1f} tok/s | {row['ratio']:.2f} |")
    out += ["", f"16 concurrent requests get {r['scale_16_over_1']:.1f}x the tokens/s of one.", ""]
    return out


def section_trl(r: dict) -> list[str]:
    return ["## Against TRL's GRPOTrainer", "",
            f"`python -m bench.vs_trl`: {r['model'].split('/')[-1]} with the same LoRA (r=8, all linear "
            f"layers), {r['prompts_per_step']} prompt x {r['group_size']} completions of exactly "
            f"{r['tokens']} tokens per step, DAPO loss, {r['steps']} timed steps after one warm-up, CPU. "
            "artsdk's step includes HTTP, capture and the SQLite store.", "",
            "| | seconds per step |", "|---|---|",
            f"| artsdk local backend | {r['artsdk_seconds_per_step']:.2f} |",
            f"| TRL GRPOTrainer 1.16 | {r['trl_seconds_per_step']:.2f} |",
            f"| speed-up | {r['speedup']:.2f}x |", ""]


def section_curve(r: dict) -> list[str]:
    rows = ["## Reward curve: tic-tac-toe on SmolLM2-135M", "",
            f"`python -m bench.reward_curve --steps {len(r['history'])}`: the tic-tac-toe example "
            f"({r['config']['scenarios_per_step']} games x group {r['config']['group_size']} per step, "
            f"random opponent, learning rate {r['config']['learning_rate']}); held-out evaluation on "
            f"{r['config']['eval_games']} games (win 1, draw 0.5, loss 0, illegal move -0.5, +0.02 per legal move).", "",
            "![reward curve](reward_curve.png)", "",
            "| step | batch mean reward | loss | groups trained | seconds |", "|---|---|---|---|---|"]
    for h in r["history"]:
        rows.append(f"| {h['step']} | {h['reward']:.3f} | {h.get('loss', 0):+.4f} | "
                    f"{int(h.get('groups_trained', 0))} | {h.get('seconds', 0):.1f} |")
    rows += ["", f"Held-out mean reward: {r['before']:.3f} before, {r['after']:.3f} after.", ""]
    return rows


def main() -> None:
    lines = ["# Benchmarks", "",
             "Measured on the project's CI machine kind (2 CPU cores, no GPU). These machines are",
             "noisy: compare the ratios of one run, not timings across runs. Each section says the",
             "command that produced it; `python -m bench.report` rewrites this page from",
             "`bench/results/`.", ""]
    for name, fn in (("capture", section_capture), ("store", section_store)):
        r = load(name)
        if r:
            lines += fn(r)
    trains = [r for r in (load("train_throughput_tiny"), load("train_throughput")) if r]
    if trains:
        lines += section_train(trains)
    for name, fn in (("inference", section_inference), ("vs_trl", section_trl), ("reward_curve", section_curve)):
        r = load(name)
        if r:
            lines += fn(r)
    DOC.write_text("\n".join(lines))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
