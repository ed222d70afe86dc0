"""`artsdk serve` as a real subprocess on 127.0.0.1, for the tests that drive it."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import httpx

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """An `artsdk serve` subprocess."""

    def __init__(self, home: Path, port: int, key: Optional[str] = KEY, cwd: Optional[Path] = None,
                 args: Sequence[str] = ()) -> None:
        """``key``: passed as --api-key (None: not passed); ``args``: more command-line arguments."""
        self.home, self.port, self.key = home, port, key
        self.cwd = cwd or home
        self.args = list(args)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def start(self) -> "Serve":
        # offline: a base model that is not on this machine fails at once instead of asking the Hub
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        self.log = open(self.home / "serve.log", "a")
        key = ["--api-key", self.key] if self.key is not None else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "artsdk.cli", "serve", "--port", str(self.port), *key,
             "--home", str(self.home), "--option", "device=cpu", *self.args],
            cwd=self.cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("artsdk serve did not start: " + (self.home / "serve.log").read_text()[-2000:])

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


