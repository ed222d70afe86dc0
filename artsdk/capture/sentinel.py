"""What happens to an LLM call that escapes capture. Sentinels sit under the HTTP libraries
agent code may reach a model through (``sentinel_httpx.py``: httpx and httpx2, which the
openai client, litellm and most frameworks use; ``sentinel_urllib.py``: http.client, under
urllib and requests; ``sentinel_aiohttp.py``; and under them all the socket,
``sentinel_socket.py``, for any other HTTP/1.1 client written in Python): a request to an
LLM route made inside a rollout while no patched call is running escaped capture -- unless
it goes to an open session's endpoint naming the rollout (its ``art.rollout_url()``), which
files it for the rollout (``backends/endpoint_record.py``). An escaped call is noted on the
trajectory (``warnings``), counted by ``art.gather``, and with ``strict_capture = true``
refused before it is sent (CaptureError, noted on the trajectory too), so a rollout never
trains on a partial record without anyone knowing.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Any, Mapping, Optional

from ..errors import CaptureError
from .context import ROLLOUT_HEADER, current_recorder, inside_call, routes

LLM_ROUTES = ("/chat/completions", "/responses", "/completions", "/messages",
              # other LLM servers' routes: Ollama, llama.cpp, Gemini, the Assistants API's runs
              "/api/chat", "/api/generate", "/completion", ":generateContent", ":streamGenerateContent")
_RUNS = re.compile(r"/threads(/[^/]+)?/runs$")
# the Realtime API: a websocket opened by a GET to this route; its messages are not captured
REALTIME_ROUTE = "/realtime"
ESCAPED = "an LLM call escaped capture"
# Set while a sentinel's library sends a request it has judged, so the sentinel under it (the
# socket's, ``sentinel_socket.py``) does not judge the same request again.
judged: ContextVar[bool] = ContextVar("artsdk_judged", default=False)


class sending_judged:  # noqa: N801 - used as a function: ``with sending_judged():``
    """Around a library sending a request its sentinel has judged: the sentinels under it let
    it pass. (A class: it runs on every request, and a generator-based context manager costs
    several times the variable it sets.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = judged.set(True)

    def __exit__(self, *exc: Any) -> None:
        judged.reset(self._token)


def check(method: str, url: str, path: str, library: str, headers: Optional[Mapping[str, Any]] = None) -> None:
    """Note (or, strict, refuse) a request about to be sent by ``library``, if it is an LLM
    call inside a rollout that no patched call is making."""
    rec = current_recorder.get()
    if rec is None or inside_call.get():
        return
    route = path.rstrip("/")
    realtime = method.upper() == "GET" and route.endswith(REALTIME_ROUTE)
    if not realtime and (method.upper() != "POST" or not (route.endswith(LLM_ROUTES) or _RUNS.search(route))):
        return
    if not realtime and _filed_by_endpoint(url, path, headers):
        return  # the backend's endpoint files it under the rollout (reconcile.py adds it to the trajectory)
    if realtime:  # a websocket: whatever the model says on it, no record of it is kept
        note = (f"{ESCAPED}: a Realtime API session (GET {url.split('?')[0]}, a websocket) was opened "
                f"through {library}; artsdk records no websocket's messages, so this trajectory does not hold "
                f"them. ")
    else:
        where = f"POST {url.split('?')[0]}"
        note = f"{ESCAPED}: {where} was sent {_how(path, library, headers)}, so this trajectory does not hold it. "
    from ..config import settings

    if settings().strict_capture:
        refused = note + "strict_capture refused to send it"
        rec.note(refused)  # the agent may catch the error: the trajectory keeps the trace
        rec.refused = rec.refused or refused
        raise CaptureError(refused)
    rec.note(note + "Make the call through the openai or anthropic client or litellm (or a framework built on "
                    "them), see docs/capture.md")


def _filed_by_endpoint(url: str, path: str, headers: Optional[Mapping[str, Any]]) -> bool:
    """A request to an open session's endpoint that names its rollout (the rollout's URL from
    ``art.rollout_url()``, or the rollout header): the endpoint records it, by rollout."""
    from urllib.parse import urlsplit

    if not routes:
        return False
    target = urlsplit(url)
    if not any(urlsplit(r.base_url).netloc == target.netloc for r in routes.values()):
        return False
    named = {k.lower() for k in (headers or {})}
    return "/r/" in path or ROLLOUT_HEADER.lower() in named


def _how(path: str, library: str, headers: Optional[Mapping[str, Any]]) -> str:
    """In the user's words, which way of calling let it past capture."""
    agent = str((headers or {}).get("user-agent") or (headers or {}).get("User-Agent") or "")
    if agent.startswith(("OpenAI/", "AsyncOpenAI/")):  # the openai client, by a road artsdk does not record
        if path.rstrip("/").endswith("/completions") and not path.rstrip("/").endswith("/chat/completions"):
            return "with the openai client's legacy completions API (client.completions.create), which artsdk " \
                   "does not record: use client.chat.completions.create or client.responses.create"
        return "with the openai client's low-level request methods (client.post / client.request), which " \
               "artsdk does not record: use client.chat.completions.create or client.responses.create"
    if agent.startswith(("Anthropic/", "AsyncAnthropic/")):
        return "with the anthropic client's low-level request methods (client.post / client.request), which " \
               "artsdk does not record: use client.messages.create or client.messages.stream"
    return f"through {library}, which artsdk does not patch"
