"""``MockServer``: a stand-in for a model server, OpenAI-compatible, on 127.0.0.1 -- for the docs'
examples, tests and benchmarks, and for trying artsdk with no model and no key. Chat completions,
the Responses API and Anthropic's Messages API (``/v1/messages``), plain and streamed, with tool
calls; it needs fastapi and uvicorn (the ``local`` or ``view`` extra).

```python
from artsdk.testing.mock_server import MockServer
from openai import OpenAI

server = MockServer().start()                      # a free port on 127.0.0.1
client = OpenAI(base_url=server.base_url, api_key="unused")
client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])  # "echo: hi"
server.stop()
```

From a shell: ``artsdk mock-server [--port 8765]``. It answers like an artsdk backend does: every choice carries ``token_ids`` and per-token
logprobs, the response names the model as ``name@step``, and it streams (SSE) and makes
tool calls. What it answers is decided by the last user message:

- ``"tool please"`` (anywhere in the text) with tools given: a call to the first tool with
  ``{"q": "<content>"}``;
  once the last message is the tool's result: ``"done: <result>"``
- ``"bad json"``: an HTTP 400 error
- ``"sleep 0.05 ..."``: waits that many seconds first
- ``"json {...}"``: answers with the JSON after the word, as is
- ``"cut stream"`` with ``stream=True``: two content chunks, then the connection ends (no
  finish reason, no ``[DONE]``), as when a server or proxy dies mid-answer
- ``"slow stream 0.2 ..."`` with ``stream=True``: waits that many seconds after each word
- anything else: ``"echo: <last user content>"``

Each character of the answer is one "token" (id = its code point), logprob -0.5.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any, Callable, Optional, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..slow_clients import KEEP_ALIVE

# a scripted answer to the messages: the text, a message dict, or None for the usual rules
Script = Callable[[list[dict[str, Any]]], Optional[Union[str, dict[str, Any]]]]

def _last_user(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list) and all(isinstance(p, dict) and "text" in p for p in c):
                return "".join(p["text"] for p in c)  # content parts: their text
            return c if isinstance(c, str) else json.dumps(c)
    return ""


def make_app(step: int = 0, script: Optional[Script] = None, ids_in_tokens: bool = False) -> FastAPI:
    """The app; ``script(messages)``, when given, answers first: the text, or a message dict
    (``content``, ``tool_calls``); None lets the rules below answer. ``ids_in_tokens``: chat
    completions carry their token ids as vLLM's ``--return-tokens-as-token-ids`` does, each
    logprob's token spelled ``"token:<id>"`` and no ``token_ids`` field."""
    app = FastAPI()
    app.state.step = step
    app.state.requests = []

    def answer(body: dict[str, Any], i: int) -> tuple[Optional[str], Optional[list[dict]]]:
        messages = body.get("messages") or []
        scripted = script(messages) if script is not None else None
        if isinstance(scripted, dict):  # a whole message: tool calls too
            return scripted.get("content"), scripted.get("tool_calls")
        if scripted is not None:
            return scripted, None
        if messages and messages[-1].get("role") == "tool":  # an agent loop goes on after its tool ran
            result = messages[-1].get("content")
            return f"done: {result if isinstance(result, str) else json.dumps(result)}", None
        text = _last_user(messages)
        if "tool please" in text and body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            return None, [{"id": f"call_{i}", "type": "function",
                           "function": {"name": name, "arguments": json.dumps({"q": text})}}]
        if text.startswith("json "):
            return text[5:], None
        suffix = f"#{i}" if body.get("n", 1) > 1 else ""
        return f"echo{suffix}: {text}", None

    def tokens_of(content: Optional[str], tool_calls: Optional[list[dict]]) -> str:
        if content is not None:
            return content
        return "".join(tc["function"]["name"] + tc["function"]["arguments"] for tc in tool_calls or ())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append({"body": body, "auth": request.headers.get("authorization"),
                                   "headers": dict(request.headers)})
        text = _last_user(body.get("messages", []))
        await _held(text)
        if text.startswith("bad json"):
            return JSONResponse({"error": {"message": "scripted failure", "type": "invalid_request_error"}},
                                status_code=400)
        model = f"{body.get('model')}@{app.state.step}"
        n = body.get("n") or 1
        prompt_ids = [ord(c) % 50000 for c in json.dumps(body.get("messages"))[:64]]
        if body.get("stream"):
            return StreamingResponse(_stream(body, model, n, answer, tokens_of, ids_in_tokens, prompt_ids),
                                     media_type="text/event-stream")
        choices = []
        for i in range(n):
            content, tool_calls = answer(body, i)
            toks = tokens_of(content, tool_calls)
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            choices.append({
                "index": i, "message": msg,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                **_token_fields(toks, ids_in_tokens),
            })
        return {
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "prompt_token_ids": prompt_ids,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": sum(len(c["logprobs"]["content"]) for c in choices),
                      "total_tokens": 0},
        }

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        """The Responses API, answering as the chat route does (the last user message of the
        input decides); a function call when tools are given and the text is "tool please"."""
        body = await request.json()
        app.state.requests.append({"body": body, "auth": request.headers.get("authorization"), "api": "responses"})
        from artsdk.trajectory.response_items import chat_messages, items_of, output_items

        messages = chat_messages(items_of(body.get("input")), body.get("instructions"))
        text = _last_user(messages)
        await _held(text)
        if text.startswith("bad json"):
            return JSONResponse({"error": {"message": "scripted failure", "type": "invalid_request_error"}},
                                status_code=400)
        chat_tools = [{"type": "function", "function": {"name": t["name"]}} for t in body.get("tools") or ()]
        content, tool_calls = answer({"messages": messages, "tools": chat_tools}, 0)
        toks = tokens_of(content, tool_calls)
        rid = f"resp_{len(app.state.requests)}"
        response = {
            "id": rid, "object": "response", "created_at": time.time(), "status": "completed",
            "model": f"{body.get('model')}@{app.state.step}", "output": output_items(content, tool_calls, rid),
            "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "usage": {"input_tokens": 3, "output_tokens": len(toks), "total_tokens": 3 + len(toks),
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
            "token_ids": [ord(c) for c in toks], "logprobs": [-0.5] * len(toks),
            "prompt_token_ids": [ord(c) % 50000 for c in json.dumps(messages)[:64]],
        }
        if not body.get("stream"):
            return response
        return StreamingResponse(_response_events(response, cut=text.startswith("cut stream")),
                                 media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        """Anthropic's Messages API, answering as the chat route does (the last user message
        decides); a tool_use block when tools are given and the text is "tool please"."""
        body = await request.json()
        auth = request.headers.get("x-api-key") or request.headers.get("authorization")  # as the client sends it
        app.state.requests.append({"body": body, "auth": auth, "api": "messages", "headers": dict(request.headers)})
        from artsdk.capture.messages_record import message_events
        from artsdk.trajectory.message_blocks import chat_messages, content_blocks

        chat = chat_messages(body.get("messages") or [], body.get("system"))
        text = _last_user(chat)
        await _held(text)
        if text.startswith("bad json"):
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "scripted failure"}}, status_code=400)
        chat_tools = [{"type": "function", "function": {"name": t["name"]}} for t in body.get("tools") or ()]
        content, tool_calls = answer({"messages": chat, "tools": chat_tools}, 0)
        toks = tokens_of(content, tool_calls)
        message = {
            "id": f"msg_{len(app.state.requests)}", "type": "message", "role": "assistant",
            "model": f"{body.get('model')}@{app.state.step}", "content": content_blocks(content, tool_calls, "mock"),
            "stop_reason": "tool_use" if tool_calls else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": len(toks)},
            "token_ids": [ord(c) for c in toks], "logprobs": [-0.5] * len(toks),
            "prompt_token_ids": [ord(c) % 50000 for c in json.dumps(chat)[:64]],
        }
        if not body.get("stream"):
            return message
        cut = text.startswith("cut stream")

        async def events() -> Any:
            for n, (name, data) in enumerate(message_events(message)):
                if cut and n == 3:
                    return  # the connection ends after the first delta: no message_stop
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
                await asyncio.sleep(0)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def _response_events(response: dict[str, Any], cut: bool) -> Any:
    """Responses API events: created, each output item with its text in word deltas, completed."""
    seq = iter(range(10**6))

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

    yield event("response.created", response={**response, "status": "in_progress", "output": []})
    for k, item in enumerate(response["output"]):
        yield event("response.output_item.added", output_index=k,
                    item={**item, "content": []} if item["type"] == "message" else {**item, "arguments": ""})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event("response.content_part.added", output_index=k, item_id=item["id"], content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []})
            for w, word in enumerate(text.split(" ")):
                yield event("response.output_text.delta", output_index=k, item_id=item["id"], content_index=0,
                            delta=word if w == 0 else " " + word, logprobs=[])
                await asyncio.sleep(0)
                if cut and w == 1:
                    return  # the connection ends: no completed event
            yield event("response.output_text.done", output_index=k, item_id=item["id"], content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", output_index=k, item_id=item["id"], content_index=0,
                        part=item["content"][0])
        else:
            yield event("response.function_call_arguments.delta", output_index=k, item_id=item["id"],
                        delta=item["arguments"])
        yield event("response.output_item.done", output_index=k, item=item)
    yield event("response.completed", response=response)


def _token_fields(toks: str, ids_in_tokens: bool) -> dict[str, Any]:
    """A choice's (or chunk's) logprobs and token ids: ids beside the tokens, as artsdk's
    backends send them, or spelled in the tokens, as vLLM's --return-tokens-as-token-ids does."""
    content = [{"token": f"token:{ord(c)}" if ids_in_tokens else c, "logprob": -0.5, "bytes": None,
                "top_logprobs": []} for c in toks]
    if ids_in_tokens:
        return {"logprobs": {"content": content}}
    return {"logprobs": {"content": content}, "token_ids": [ord(c) for c in toks]}


async def _held(said: str) -> None:
    """``"sleep 0.05 ..."``: wait that many seconds before answering, on any route."""
    if said.startswith("sleep "):
        await asyncio.sleep(float(said.split()[1]))


def _pause(said: str) -> float:
    """The seconds ``"slow stream 0.2 ..."`` asks to wait after each streamed word."""
    try:
        return float(said.split()[2])
    except (IndexError, ValueError):
        return 0.0


async def _stream(body: dict[str, Any], model: str, n: int, answer: Any, tokens_of: Any,
                  ids_in_tokens: bool = False, prompt_ids: Optional[list[int]] = None) -> Any:
    created = int(time.time())

    def chunk(i: int, delta: dict[str, Any], finish: Optional[str] = None,
              toks: str = "", prompt: Optional[list[int]] = None) -> str:
        c: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
        if toks:
            c.update(_token_fields(toks, ids_in_tokens))
        data = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [c], **({"prompt_token_ids": prompt} if prompt else {})}
        return f"data: {json.dumps(data)}\n\n"

    said = _last_user(body.get("messages", []))
    pause = _pause(said) if said.startswith("slow stream ") else 0.0
    if said.startswith("cut stream"):
        yield chunk(0, {"role": "assistant", "content": "half"}, toks="half")
        yield chunk(0, {"content": " an"}, toks=" an")
        return
    for i in range(n):
        content, tool_calls = answer(body, i)
        yield chunk(i, {"role": "assistant", "content": ""}, prompt=prompt_ids if i == 0 else None)  # as vLLM's first
        if tool_calls:
            for j, tc in enumerate(tool_calls):
                name, args = tc["function"]["name"], tc["function"]["arguments"]
                yield chunk(i, {"tool_calls": [{"index": j, "id": tc["id"], "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}, toks=name)
                half = len(args) // 2
                for piece in (args[:half], args[half:]):
                    yield chunk(i, {"tool_calls": [{"index": j, "function": {"arguments": piece}}]},
                                toks=piece)
            yield chunk(i, {}, "tool_calls")
        else:
            words = content.split(" ")
            for k, w in enumerate(words):
                piece = w if k == 0 else " " + w
                yield chunk(i, {"content": piece}, toks=piece)
                await asyncio.sleep(pause)
            yield chunk(i, {}, "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        data = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                         "total_tokens": 2}}
        yield f"data: {json.dumps(data)}\n\n"
    yield "data: [DONE]\n\n"


class MockServer:
    """Runs the app with uvicorn in a background thread on a free 127.0.0.1 port."""

    def __init__(self, step: int = 0, script: Optional[Script] = None, ids_in_tokens: bool = False) -> None:
        self.app = make_app(step, script, ids_in_tokens)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=KEEP_ALIVE)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.app.state.requests

    def set_step(self, step: int) -> None:
        self.app.state.step = step

    def start(self) -> "MockServer":
        """Serve in a background thread; returns itself once it answers."""
        return self.__enter__()

    def stop(self) -> None:
        self.__exit__()

    def __enter__(self) -> "MockServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the mock server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def serve(port: int = 8765, host: str = "127.0.0.1") -> None:
    """Run it in the foreground until interrupted (``artsdk mock-server``)."""
    print(f"artsdk mock-server: http://{host}:{port}/v1 (an OpenAI-compatible stand-in: it echoes, and calls the "
          f"first tool when asked \"tool please\")", flush=True)
    uvicorn.run(make_app(), host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE)


if __name__ == "__main__":  # python -m artsdk.testing.mock_server PORT  (used by the benchmarks)
    import sys

    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 8765)
