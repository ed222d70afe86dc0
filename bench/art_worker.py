"""OpenPipe ART's side of bench/capture_vs_art.py, run by ART's own Python (a venv with
``openpipe-art`` and the openai client it installs beside; artsdk is not there). It reads one
JSON command a line from stdin -- ``{"captured": bool, "stream": bool, "n": int, "toggle": bool}``
-- makes ``n`` chat-completion calls to the URL it was given, and writes the seconds per call as
one JSON line. A captured call runs in an ``AutoTrajectoryContext`` of its own (what
``capture_auto_trajectory`` opens: one rollout of one call) with ART's httpx patches in place;
an uncaptured one outside any context, with the patches in place too -- or, with ``toggle``,
with httpx's own methods put back, as before ``import art``. With ``"counted": true`` the calls
run inside one ``functools.reduce``: what ``capture_vs_art.py --instructions`` counts.
``{"paired": true, "stream": bool, "n": int}`` makes ``n`` pairs of one uncaptured and one
captured call instead (bench/paired.py, patches in place) and writes each pair's differences.

    <art venv>/bin/python bench/art_worker.py http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import functools
import json
import sys
import time

import httpx
from openai import OpenAI

PATCHED = ("iter_bytes", "aiter_bytes", "close", "aclose")
ORIGINAL = {name: getattr(httpx.Response, name) for name in PATCHED}

import art  # noqa: E402,F401  (patches httpx.Response on import)
from art.auto_trajectory import AutoTrajectoryContext  # noqa: E402

ART = {name: getattr(httpx.Response, name) for name in PATCHED}
MSGS = [{"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "what is the capital of France? answer in one word please"}]


def call(client: OpenAI, stream: bool) -> None:
    out = client.chat.completions.create(model="m", messages=MSGS, stream=stream)
    if stream:
        for _ in out:
            pass


def paired(client: OpenAI, stream: bool, n: int) -> dict[str, list[float]]:
    from paired import pairs  # bench/paired.py: this script's folder is on the path

    put(ART)
    trajectories = []

    def captured() -> None:
        with AutoTrajectoryContext() as trajectory:
            call(client, stream)
        trajectories[:] = [trajectory]

    out = pairs(lambda: call(client, stream), captured, n)
    check(trajectories[0])
    return out


def put(methods: dict[str, object]) -> None:
    """httpx.Response's methods as ``methods`` has them (ART's patches, or httpx's own)."""
    for name, fn in methods.items():
        if getattr(httpx.Response, name) is not fn:  # setting a class's method, even to itself, resets the
            setattr(httpx.Response, name, fn)        # interpreter's caches for code using the class


def check(trajectory: object) -> None:
    if len(trajectory.messages_and_choices) != len(MSGS) + 1:  # or this measures nothing
        raise SystemExit(f"ART captured {trajectory.messages_and_choices!r}")


def run(client: OpenAI, captured: bool, stream: bool, n: int, toggle: bool = False, counted: bool = False) -> float:
    put(ART if captured or not toggle else ORIGINAL)
    trajectories = []

    def one(*_: object) -> None:
        if captured:
            with AutoTrajectoryContext() as trajectory:
                call(client, stream)
            trajectories[:] = [trajectory]
        else:
            call(client, stream)

    t0 = time.perf_counter()
    if counted:  # inside one C call, for the instruction counter (capture_vs_art.py)
        functools.reduce(one, range(n), None)
    else:
        for _ in range(n):
            one()
    seconds = (time.perf_counter() - t0) / n
    if captured:
        check(trajectories[0])
    return seconds


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="k", max_retries=0)
    from importlib.metadata import version

    print(json.dumps({"art": version("openpipe-art"), "openai": version("openai")}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("paired"):
            print(json.dumps(paired(client, cmd["stream"], cmd["n"])), flush=True)
            continue
        seconds = run(client, cmd["captured"], cmd["stream"], cmd["n"], cmd.get("toggle", False), cmd.get("counted", False))
        print(json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
