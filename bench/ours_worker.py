"""artsdk's side of ``bench/capture_vs_art.py --instructions``: the worker protocol of
``bench/art_worker.py`` (one JSON command a line, ``{"captured", "stream", "n", "toggle"}``, the
seconds per call back; ``"counted"`` runs the calls inside one ``functools.reduce``), with
artsdk's capture, so that both systems can be run under the same instruction counter.

    python bench/ours_worker.py http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import artsdk as art  # noqa: E402
from artsdk import capture  # noqa: E402
from openai import OpenAI  # noqa: E402

MSGS = [{"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "what is the capital of France? answer in one word please"}]


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="k", max_retries=0)

    def call(stream: bool) -> None:
        out = client.chat.completions.create(model="m", messages=MSGS, stream=stream)
        if stream:
            for _ in out:
                pass

    one = art.rollout(name="bench")(call)  # a plain call of a rollout: recorded, not stored
    from importlib.metadata import version

    print(json.dumps({"artsdk": art.__version__, "openai": version("openai")}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        (capture.install if cmd["captured"] or not cmd.get("toggle") else capture.uninstall)()
        f = one if cmd["captured"] else call
        t0 = time.perf_counter()
        if cmd.get("counted"):  # inside one C call, for the instruction counter (capture_vs_art.py)
            functools.reduce(lambda _, __: f(cmd["stream"]), range(cmd["n"]), None)
        else:
            for _ in range(cmd["n"]):
                f(cmd["stream"])
        print(json.dumps({"seconds": (time.perf_counter() - t0) / cmd["n"]}), flush=True)


if __name__ == "__main__":
    main()
