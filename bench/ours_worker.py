"""artsdk's side of ``bench/capture_vs_art.py``: the worker protocol of ``bench/art_worker.py``
(one JSON command a line, ``{"captured", "stream", "n", "toggle", "counted"}``, the seconds per
call back; or ``{"paired": true, "stream", "n"}``, each pair's differences back), making
artsdk's calls as ``capture_vs_art.ours`` and ``ours_paired`` make them, so that both systems
are timed and counted alike: each in a process of its own, fresh for every run.

    python bench/ours_worker.py http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import artsdk as art  # noqa: E402
from bench.capture_vs_art import ours, ours_paired  # noqa: E402
from openai import OpenAI  # noqa: E402


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="k", max_retries=0)
    from importlib.metadata import version

    print(json.dumps({"artsdk": art.__version__, "openai": version("openai")}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("paired"):
            print(json.dumps(ours_paired(client, cmd["stream"], cmd["n"])), flush=True)
            continue
        seconds = ours(client, cmd["captured"], cmd["stream"], cmd["n"], cmd.get("toggle", False),
                       cmd.get("counted", False))
        print(json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
