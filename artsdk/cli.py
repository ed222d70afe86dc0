"""The ``artsdk`` command.

    artsdk trajectories list [--project P] [--model M] [--run R] [--step N] [--min-reward X] [--errors]
    artsdk runs [--project P] [--model M]
    artsdk store recover [--store URL] [--from FOLDER]
    artsdk trajectories show ID
    artsdk trajectories export OUT.jsonl [filters]
    artsdk config
    artsdk serve [--backend local] [--host 127.0.0.1] [--port 7999] [--api-key-file FILE] [--home DIR]
    artsdk train examples/tic_tac_toe [--steps 5 --base-model tiny ...]
    artsdk view [--store URL] [--port 7800]
    artsdk mock-server [--port 8765]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

from ._version import __version__
from .errors import ArtError


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="store path or URL (default: from the settings)")
    p.add_argument("--project")
    p.add_argument("--model")
    p.add_argument("--run", help="a training run (`artsdk runs` lists them)")
    p.add_argument("--step", type=int)
    p.add_argument("--rollout")
    p.add_argument("--group", dest="group_id")
    p.add_argument("--min-reward", type=float)
    p.add_argument("--max-reward", type=float)
    errs = p.add_mutually_exclusive_group()
    errs.add_argument("--errors", dest="error", action="store_const", const=True,
                      help="only failed rollouts")
    errs.add_argument("--ok", dest="error", action="store_const", const=False,
                      help="only rollouts that finished")


def _filter_values(a: argparse.Namespace) -> dict[str, Any]:
    keys = ("project", "model", "run", "step", "rollout", "group_id", "min_reward", "max_reward", "error")
    return {k: getattr(a, k) for k in keys if getattr(a, k) is not None}


def _store(a: argparse.Namespace) -> Any:
    from .store import Store

    return Store(a.store) if a.store else Store()


def _fmt_reward(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.3f}"


def cmd_list(a: argparse.Namespace) -> int:
    with _store(a) as store:
        trajs = store.trajectories(limit=a.limit, newest_first=True, **_filter_values(a))
        total = store.count(**_filter_values(a))
    if a.json:
        for t in trajs:
            print(t.model_dump_json(fallback=repr))
        return 0
    if a.ids:
        print("\n".join(t.id for t in trajs))
        return 0
    print(f"{'id':10} {'started':19} {'rollout':18} {'model':14} {'run':20} {'step':>4} {'calls':>5} "
          f"{'reward':>7}  status")
    for t in trajs:
        status = f"error: {t.error.type}" if t.error else ("no calls" if not t.calls else "ok")
        print(f"{t.id[:10]:10} {t.started_at:%Y-%m-%d %H:%M:%S} {t.rollout[:18]:18} "
              f"{(t.model or '-')[:14]:14} {(t.run or '-')[:20]:20} {t.step if t.step is not None else '-':>4} "
              f"{len(t.calls):>5} {_fmt_reward(t.reward):>7}  {status}")
    print(f"{len(trajs)} of {total} shown")
    return 0


def _content(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
    text = c or ""
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function", {})
        text += f"\n  -> {fn.get('name')}({fn.get('arguments')})"
    return text


def cmd_show(a: argparse.Namespace) -> int:
    with _store(a) as store:
        t = store.get(a.id)
    if a.json:
        print(t.model_dump_json(indent=2, fallback=repr))
        return 0
    print(f"trajectory {t.id}  rollout {t.rollout}  project {t.project}  model {t.model}  run {t.run}  step {t.step}")
    print(f"started {t.started_at:%Y-%m-%d %H:%M:%S}  {t.duration:.2f}s  reward {_fmt_reward(t.reward)}")
    print(f"scenario: {json.dumps(t.scenario, default=repr)[:300]}")
    for name, value in t.rewards.items():
        print(f"  reward {name} = {value:.4f}")
    for w in t.warnings:
        print(f"  warning: {w}")
    for call in t.calls:
        trained = " token ids+logprobs" if call.choices and call.choices[0].trainable else ""
        print(f"\n-- call {call.index}: {call.provider} {call.model} -> {call.served_by}"
              f"{' (stream)' if call.stream else ''} {call.latency * 1000:.0f} ms{trained}")
        shown = call.messages if call.index == 0 else call.messages[-2:]
        for m in shown:
            print(f"[{m.get('role')}] {_content(m)}")
        for ch in call.choices:
            print(f"[assistant#{ch.index}] {_content(ch.message)}  ({ch.finish_reason})")
        if call.error:
            print(f"  call failed: {call.error}")
    print(f"\noutcome: {json.dumps(t.outcome, default=repr)[:500]}")
    if t.error:
        print(f"\nerror: {t.error.type}: {t.error.message}\n{t.error.traceback}")
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from pathlib import Path

    to_file = a.out is not sys.stdout
    if to_file and Path(a.out).exists() and not a.force:
        print(f"artsdk: {a.out} exists; give another file name, or --force to write over it", file=sys.stderr)
        return 2
    with _store(a) as store:
        if not store.count(**_filter_values(a)):
            print(f"no trajectory in {store} matches these filters; nothing was written", file=sys.stderr)
            return 1
        n = store.export_jsonl(a.out, **_filter_values(a))
    print(f"wrote {n} trajectories to {a.out if to_file else 'standard output'}", file=sys.stderr)
    return 0


def cmd_runs(a: argparse.Namespace) -> int:
    import time

    with _store(a) as store:
        runs = store.runs(project=a.project, model=a.model)
    if a.json:
        print(json.dumps(runs, indent=2, default=str))
        return 0
    print(f"{'project':16} {'model':16} {'run':22} {'started':19} {'steps':>5} {'trajectories':>12}  base model")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_at"]))
        print(f"{r['project'][:16]:16} {r['model'][:16]:16} {r['run'][:22]:22} {started:19} "
              f"{r['last_step'] if r['last_step'] is not None else 0:>5} {r['trajectories']:>12}  {r['base_model']}")
    print(f"{len(runs)} runs" + ("" if runs else " (a run begins with each art.session)"))
    return 0


def cmd_recover(a: argparse.Namespace) -> int:
    with _store(a) as store:
        report = store.recover(a.folder)
    print(report)
    return 1 if report.failed else 0


def cmd_config(a: argparse.Namespace) -> int:
    from .config import settings

    s = settings()
    data = s.model_dump()
    if data.get("api_key"):
        data["api_key"] = "***"
    data["store_url"] = s.store_url
    print(json.dumps(data, indent=2))
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    import json as _json
    import logging
    import os

    from .config import settings

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options: dict[str, Any] = dict(settings().backend_options)
    for item in a.option or ():
        key, sep, value = item.partition("=")
        if not sep:
            print(f"artsdk serve: --option takes key=value, got {item!r}", file=sys.stderr)
            return 2
        try:
            options[key] = _json.loads(value)
        except ValueError:
            options[key] = value
    serve = _command("serve")
    if serve is None:
        print("artsdk serve needs the server extras; pip install 'artsdk[local]'", file=sys.stderr)
        return 2
    key = a.api_key
    if a.api_key_file:
        try:
            key = open(a.api_key_file).read().strip()
        except OSError as e:
            print(f"artsdk serve: cannot read --api-key-file: {e}", file=sys.stderr)
            return 2
        if not key:
            print(f"artsdk serve: --api-key-file {a.api_key_file} is empty", file=sys.stderr)
            return 2
    serve(a.backend, a.host, a.port, key or os.environ.get("ARTSDK_API_KEY") or settings().api_key,
          a.home, **options)
    return 0


def _command(name: str) -> Any:
    """A command another distribution provides (entry points in ``artsdk.commands``, e.g.
    ``serve``, from the backends); None when none is installed or it cannot be imported."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="artsdk.commands", name=name):
        try:
            return ep.load()
        except ImportError as e:
            print(f"artsdk {name}: {ep.value} cannot be imported ({e})", file=sys.stderr)
    return None


def cmd_view(a: argparse.Namespace) -> int:
    import os

    try:
        from .viewer.app import serve
    except ImportError as e:  # pragma: no cover - fastapi / uvicorn missing
        print(f"artsdk view needs the viewer's extras ({e}); pip install 'artsdk[view]'", file=sys.stderr)
        return 2
    key = os.environ.get("ARTSDK_VIEW_KEY")
    if a.api_key_file:
        try:
            key = open(a.api_key_file).read().strip() or None
        except OSError as e:
            print(f"artsdk view: cannot read --api-key-file: {e}", file=sys.stderr)
            return 2
    serve(a.store, a.host, a.port, key)
    return 0


def cmd_mock_server(a: argparse.Namespace) -> int:
    try:
        from .testing.mock_server import serve
    except ImportError as e:  # pragma: no cover - fastapi / uvicorn missing
        print(f"artsdk mock-server needs fastapi and uvicorn ({e}); pip install 'artsdk[view]'", file=sys.stderr)
        return 2
    serve(a.port)
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    """Run ``<folder>/train.py`` as a module (``examples/tic_tac_toe`` -> ``examples.tic_tac_toe.train``)."""
    import runpy
    from pathlib import Path

    folder = Path(a.path).resolve()
    if not (folder / "train.py").is_file():
        print(f"artsdk train: {a.path} has no train.py (give a folder like examples/tic_tac_toe)", file=sys.stderr)
        return 2
    # the folder's module name counts every package above it (examples/tic_tac_toe ->
    # examples.tic_tac_toe), wherever it is run from
    root, parts = folder, [folder.name]
    while (root / "__init__.py").is_file() and (root.parent / "__init__.py").is_file():
        root = root.parent
        parts.insert(0, root.name)
    root = root.parent
    module = ".".join(parts) + ".train"
    sys.path.insert(0, str(root))
    sys.argv = [str(folder / "train.py"), *a.args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="artsdk", description="Train LLM agents with RL.")
    p.add_argument("--version", action="version", version=f"artsdk {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("trajectories", help="look at stored trajectories")
    tsub = t.add_subparsers(dest="action", required=True)
    ls = tsub.add_parser("list", help="newest trajectories first")
    _filters(ls)
    ls.add_argument("--limit", type=int, default=20)
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.add_argument("--ids", action="store_true", help="only the ids, one per line")
    ls.set_defaults(func=cmd_list)
    show = tsub.add_parser("show", help="one trajectory, call by call")
    show.add_argument("id", help="trajectory id (or a unique prefix of 6+ characters)")
    show.add_argument("--store")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    ex = tsub.add_parser("export", help="write trajectories as JSON Lines")
    ex.add_argument("out", help="output file (.jsonl); '-' for stdout")
    ex.add_argument("--force", action="store_true", help="write over an existing file")
    _filters(ex)
    ex.set_defaults(func=cmd_export)

    rn = sub.add_parser("runs", help="training runs, newest first: each art.session is one")
    rn.add_argument("--store", help="store path or URL (default: from the settings)")
    rn.add_argument("--project")
    rn.add_argument("--model")
    rn.add_argument("--json", action="store_true")
    rn.set_defaults(func=cmd_runs)

    st = sub.add_parser("store", help="look after the store")
    stsub = st.add_subparsers(dest="action", required=True)
    rc = stsub.add_parser("recover", help="put back writes that failed (kept in unsaved/ beside the store)")
    rc.add_argument("--store", help="store path or URL (default: from the settings)")
    rc.add_argument("--from", dest="folder", help="the folder of failed writes (default: unsaved/ beside the store)")
    rc.set_defaults(func=cmd_recover)

    sv = sub.add_parser("serve", help="serve a training backend over HTTP (for backend = \"remote\")")
    sv.add_argument("--backend", default="local", help="backend to serve (default: local)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    sv.add_argument("--port", type=int, default=7999)
    keys = sv.add_mutually_exclusive_group()
    keys.add_argument("--api-key", help="require this key (visible in the process list: prefer --api-key-file "
                                        "or ARTSDK_API_KEY)")
    keys.add_argument("--api-key-file", help="read the key from this file (default: ARTSDK_API_KEY / api_key setting)")
    sv.add_argument("--home", help="folder for checkpoints and the model registry (default: home setting)")
    sv.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="a backend option, e.g. --option device=cuda (repeatable)")
    sv.set_defaults(func=cmd_serve)

    vw = sub.add_parser("view", help="a web page over the store: reward curves, groups, trajectories, comparisons")
    vw.add_argument("--store", help="store path or URL (default: from the settings)")
    vw.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    vw.add_argument("--port", type=int, default=7800)
    vw.add_argument("--api-key-file", help="require the key in this file (default: ARTSDK_VIEW_KEY, or none)")
    vw.set_defaults(func=cmd_view)

    tr = sub.add_parser("train", help="train an example (or any folder with a train.py)")
    tr.add_argument("path", help="e.g. examples/tic_tac_toe")
    tr.add_argument("args", nargs=argparse.REMAINDER, help="passed on, e.g. --steps 5 --base-model tiny")
    tr.set_defaults(func=cmd_train)

    ms = sub.add_parser("mock-server", help="a stand-in OpenAI-compatible server on 127.0.0.1 (echoes; calls a "
                                             "tool when asked \"tool please\"): try artsdk with no model")
    ms.add_argument("--port", type=int, default=8765)
    ms.set_defaults(func=cmd_mock_server)

    c = sub.add_parser("config", help="print the effective settings")
    c.set_defaults(func=cmd_config)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "out", None) == "-":
        args.out = sys.stdout
    try:
        return int(args.func(args) or 0)
    except ArtError as e:
        print(f"artsdk: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `artsdk trajectories list | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
