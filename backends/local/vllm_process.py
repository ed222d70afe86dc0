"""vLLM's OpenAI server, stopped when the process that started it goes away.

    python -m backends.local.vllm_process <vllm serve arguments>

vllm_engine.py starts vLLM through this module and holds the write end of its stdin. When
the starter exits in any way -- closed, crashed, killed with SIGKILL -- that pipe reaches end
of file, and this process stops its whole process group (vLLM's engine processes included):
SIGTERM, then SIGKILL if it is still there 30 s later. No vLLM outlives the run that started
it and keeps its memory.
"""

import os
import runpy
import signal
import sys
import threading
import time


def _watch() -> None:
    while os.read(0, 4096):  # empty at end of file: the starter is gone (os.read: no buffer lock at exit)
        pass
    os.killpg(0, signal.SIGTERM)
    time.sleep(30)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    threading.Thread(target=_watch, name="artsdk-starter-watch", daemon=True).start()
    sys.argv = ["vllm-api-server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
