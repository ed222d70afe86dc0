"""The session's key on every route of the vLLM server the vLLM engine starts, named to vLLM
as ``--middleware backends.local.vllm_guard.KeyOnEveryRoute``.

vLLM checks its ``--api-key`` only on paths under ``/v1``; its other routes (``/invocations``,
``/tokenize``, ``/pooling``, ``/sleep``...) answer anyone who can reach the port. This puts the
same check as the backends' own servers in front of all of them but ``/health``. The key comes
from the environment the engine starts vLLM with (``VLLM_API_KEY``, a fresh random one).
"""

from __future__ import annotations

import os
from typing import Any

from ..http import BODY_TIMEOUT, Guard

NO_BODY_LIMIT = 2**62  # vLLM keeps its own limits on what a request may ask for


class KeyOnEveryRoute(Guard):
    """The backends' guard (``backends/http.py``) with vLLM's own key; built by vLLM with the
    app alone."""

    def __init__(self, app: Any) -> None:
        key = os.environ.get("VLLM_API_KEY")
        if not key:
            raise RuntimeError("VLLM_API_KEY is not set: the vLLM engine starts vLLM with a key of its own")
        super().__init__(app, key, NO_BODY_LIMIT, BODY_TIMEOUT)
