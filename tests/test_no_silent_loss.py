"""No LLM call inside a rollout is lost silently, whatever sends it: the openai client from a
thread, an executor or ``run_in_executor`` is recorded; ``requests``, ``urllib`` and
``aiohttp`` are reported by method and URL, and refused under strict capture before anything
is sent (the refusal stays on the trajectory when the agent catches it); the openai client's
legacy completions and low-level ``post()`` are named as such. And what is recorded is plain
data: openai objects nested in dict messages are dumped, so the stored trajectory, the
in-memory one and a replay agree. All against the scripted server on 127.0.0.1."""

import asyncio
import importlib.util
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import artsdk as art
from artsdk.capture.sentinel import ESCAPED

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "hi"}]


def body():
    return json.dumps({"model": "m", "messages": USER}).encode()


# -- the openai client in threads is recorded ------------------------------------------------

async def test_calls_from_threads_and_executors_are_recorded(sync_client, async_client):
    def ask(text):
        return sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}]) \
            .choices[0].message.content

    @art.rollout
    async def agent() -> list:
        out = []
        with ThreadPoolExecutor(2) as pool:
            out += list(pool.map(ask, ["pool a", "pool b"]))
        out.append(await asyncio.get_running_loop().run_in_executor(None, ask, "executor"))
        box = []
        worker = threading.Thread(target=lambda: box.append(ask("thread")))
        worker.start()
        worker.join()
        out += box
        out.append((await async_client.chat.completions.create(model="m", messages=USER)).choices[0].message.content)
        return out

    t = await agent.collect()
    assert t.error is None and len(t.outcome) == 5
    assert sorted(c.messages[0]["content"] for c in t.calls) == ["executor", "hi", "pool a", "pool b", "thread"]
    assert not t.warnings  # all five recorded: none escaped (4 of 5 were lost without a word before)


@pytest.mark.parametrize("kind", ["executor", "thread pool"])
def test_a_pool_made_inside_a_rollout_is_not_that_rollout_afterwards(sync_client, caplog, kind):
    """A pool made inside a rollout serves later work too: a call handed to it after the
    rollout, outside any, is nobody's -- not the old rollout's "late" call -- and the old
    rollout's recording is not kept alive by the pool's threads."""
    import gc
    from multiprocessing.pool import ThreadPool

    from artsdk.capture import Recorder, current_recorder

    def in_pool(pool, fn, *args):
        return pool.submit(fn, *args).result() if kind == "executor" else pool.apply_async(fn, args).get(30)

    def ask(text):
        return sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])

    made, seen = [], []

    @art.rollout
    def agent():
        seen.append(id(current_recorder.get()))
        made.append(ThreadPoolExecutor(1) if kind == "executor" else ThreadPool(1))  # its threads start here
        return in_pool(made[0], ask, "inside")

    t = agent.collect_sync()
    (pool,) = made
    try:
        assert [c.messages[0]["content"] for c in t.calls] == ["inside"]
        assert in_pool(pool, current_recorder.get) is None  # (it was the old rollout's)
        with caplog.at_level("WARNING", logger="artsdk.capture"):
            in_pool(pool, ask, "after")
        assert "after its rollout" not in caplog.text
        gc.collect()
        assert not any(type(o) is Recorder and id(o) == seen[0] for o in gc.get_objects())  # that Recorder is gone
    finally:
        pool.shutdown() if kind == "executor" else (pool.close(), pool.join())


async def test_a_worker_thread_a_rollout_started_keeps_none_of_its_calls(sync_client):
    """A sync rollout run by ``art.gather`` runs in one of anyio's worker threads, started inside
    the first such rollout and serving the later ones in a copy of its context: that copy holds
    the first rollout's recorder, but no longer its calls once the rollout has ended."""
    import gc

    from artsdk.trajectory.records import LLMCall

    mark = f"worker-thread-test {id(sync_client)}"

    @art.rollout
    def agent(i):
        return sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{mark} {i}"}])

    trajectories = [await agent.run((i,)) for i in range(3)]
    assert [len(t.calls) for t in trajectories] == [1, 1, 1]
    del trajectories
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is LLMCall and o.messages[0]["content"].startswith(mark)]


# -- other HTTP libraries are reported, or refused under strict capture ----------------------

def send_with(library, url):
    if library == "requests":
        import requests

        return requests.post(url + "/chat/completions", data=body(), headers={"content-type": "application/json"},
                             timeout=30).status_code
    if library == "urllib":
        req = urllib.request.Request(url + "/chat/completions", data=body(), method="POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status

    import aiohttp

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/chat/completions", data=body(), headers={"content-type": "application/json"}) as r:
                return r.status

    return asyncio.run(go())


@pytest.mark.parametrize("library", ["requests", "urllib", "aiohttp"])
def test_calls_through_other_http_libraries_are_named_or_refused(server, library):
    @art.rollout
    def agent() -> int:
        return send_with(library, server.base_url)

    reported_then_refused(agent, server, "does not patch")


def reported_then_refused(agent, server, how):
    """``agent``'s one POST to the server's chat route is sent and reported once, saying
    ``how``; under strict capture it is refused before anything is sent."""
    before = len(server.requests)
    t = agent.collect_sync()
    assert t.outcome in (200, b"HTTP/1.1 200") and len(server.requests) == before + 1
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]  # none before: silently lost
    assert f"POST {server.base_url}/chat/completions" in warning and how in warning

    art.configure(strict_capture=True)
    try:
        t = agent.collect_sync()
    finally:
        art.configure(strict_capture=None)
    assert t.error is not None and t.error.type == "CaptureError"  # refused...
    assert len(server.requests) == before + 1  # ...before anything was sent (it was sent before)
    assert any("strict_capture refused" in w for w in t.warnings)


def test_a_refusal_the_agent_catches_stays_on_the_trajectory(server):
    @art.rollout
    def agent() -> str:
        try:
            send_with("urllib", server.base_url)
        except art.CaptureError:
            return "carried on"
        return "sent"

    art.configure(strict_capture=True)
    try:
        t = agent.collect_sync()
    finally:
        art.configure(strict_capture=None)
    assert t.outcome == "carried on" and t.error is None
    assert any(w.startswith(ESCAPED) and "strict_capture refused" in w for w in t.warnings)  # no trace before


def test_the_openai_client_s_own_escapes_are_named(sync_client):
    @art.rollout
    def legacy() -> None:
        try:
            sync_client.completions.create(model="m", prompt="hi")
        except Exception:  # noqa: BLE001 - the scripted server has no legacy route: the call is what matters
            pass

    @art.rollout
    def low_level() -> None:
        import openai

        sync_client.post("/chat/completions", body={"model": "m", "messages": USER}, cast_to=openai.types.chat.ChatCompletion)

    t = legacy.collect_sync()
    assert any("legacy completions API (client.completions.create)" in w for w in t.warnings), t.warnings
    t = low_level.collect_sync()
    assert any("low-level request methods (client.post" in w for w in t.warnings), t.warnings
    assert not any("a client artsdk does not patch" in w for w in t.warnings)  # what it said before


# -- openai objects nested in dict messages ----------------------------------------------------

async def test_openai_objects_in_dict_messages_are_stored_as_data(async_client, art_store):
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]

    @art.rollout
    async def agent() -> str:
        messages = [{"role": "user", "content": "tool please"}]
        first = await async_client.chat.completions.create(model="m", messages=messages, tools=tools)
        msg = first.choices[0].message
        # the common pattern: the answer's tool calls (openai objects) put back in a dict message
        messages += [{"role": "assistant", "content": msg.content, "tool_calls": msg.tool_calls},
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "found it"}]
        second = await async_client.chat.completions.create(model="m", messages=messages, tools=tools)
        return second.choices[0].message.content

    t = await agent.collect()
    assert t.outcome == "done: found it"
    json.dumps([c.messages for c in t.calls])  # TypeError: ChatCompletionMessageToolCall is not JSON, before
    call = t.calls[1].messages[1]["tool_calls"][0]
    assert isinstance(call, dict) and call["function"]["name"] == "look"
    stored = art_store.get(t.id)
    assert [c.messages for c in stored.calls] == [c.messages for c in t.calls]  # they differed before
    if importlib.util.find_spec("torch") is not None:  # the local backend renders it for training
        from backends.local.chat import message_text

        assert "look" in message_text(t.calls[1].messages[1])  # raised before
    again = await art.replay.rerun(agent, stored)
    assert again.error is None and again.outcome == t.outcome


# -- other LLM servers' routes are named too --------------------------------------------------

@pytest.mark.parametrize("route", ["/api/chat", "/api/generate", "/completion", "/models/gemini:generateContent",
                                   "/threads/thread_1/runs", "/threads/runs"])
def test_other_llm_servers_routes_are_reported_by_url(server, route):
    import httpx

    @art.rollout
    def agent() -> int:
        return httpx.post(server.base_url.removesuffix("/v1") + route, content=body(), timeout=30).status_code

    t = agent.collect_sync()
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]  # sent unreported before
    assert f"POST {server.base_url.removesuffix('/v1')}{route}" in warning


def test_a_post_that_is_no_llm_call_is_not_reported(server):
    import httpx

    @art.rollout
    def agent() -> int:
        return httpx.post(server.base_url.removesuffix("/v1") + "/api/users", content=b"{}", timeout=30).status_code

    assert not [w for w in agent.collect_sync().warnings if w.startswith(ESCAPED)]


# -- below the HTTP libraries: any other HTTP/1.1 client is seen at the socket ---------------

def post_below(how, base_url):
    """POST a chat body to ``base_url``/chat/completions with a client no other sentinel sits in."""
    from urllib.parse import urlsplit

    url = base_url + "/chat/completions"
    where = urlsplit(url)
    head = (f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body())}\r\nConnection: close\r\n\r\n").encode() + body()
    if how == "socket":
        import socket

        with socket.create_connection((where.hostname, where.port), timeout=30) as s:
            s.sendall(head)
            return s.recv(12)
    if how == "asyncio":
        return asyncio.run(asyncio_post(where.hostname, where.port, head))
    if how == "httpcore":
        import httpcore

        with httpcore.ConnectionPool() as pool:
            return pool.request("POST", url, content=body()).status
    if how == "an httpx transport":
        import httpx

        with httpx.HTTPTransport() as transport:
            return transport.handle_request(httpx.Request("POST", url, content=body())).status_code
    niquests = pytest.importorskip("niquests")  # over urllib3-future, which replaces urllib3 (the oldest row)
    if how == "niquests":
        return niquests.post(url, data=body(), timeout=30).status_code
    import requests
    import urllib3

    assert hasattr(urllib3, "_async"), "urllib3-future is not the urllib3 installed"  # http.client is not under it
    return requests.post(url, data=body(), timeout=30).status_code


async def asyncio_post(host, port, head, ssl=None):
    """Send a whole request with asyncio's streams; the status line's start."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
    writer.write(head)
    await writer.drain()
    answer = await reader.read(12)
    writer.close()
    return answer


@pytest.mark.parametrize("how", ["socket", "asyncio", "httpcore", "an httpx transport", "niquests",
                                 "requests over urllib3-future"])
def test_a_request_below_the_http_libraries_is_seen_at_the_socket(server, how):
    @art.rollout
    def agent():
        return post_below(how, server.base_url)

    reported_then_refused(agent, server, "a plain socket")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate: it answers every request
    200 and keeps the request lines it was sent."""
    import datetime
    import socket
    import ssl

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(__import__("ipaddress")
                                                                        .ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    lines = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    lines.append(tls.recv(65536).split(b"\r\n")[0])
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except (OSError, ssl.SSLError):
                continue

    threading.Thread(target=serve, daemon=True).start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}/v1", str(folder / "cert.pem"), lines
    listener.close()


@pytest.mark.parametrize("how", ["ssl socket", "asyncio over TLS"])
def test_a_request_over_tls_is_seen_before_it_is_encrypted(tls_server, how):
    import ssl
    from urllib.parse import urlsplit

    base_url, cafile, lines = tls_server
    where = urlsplit(base_url + "/chat/completions")
    head = (f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Length: {len(body())}\r\n"
            f"Connection: close\r\n\r\n").encode() + body()
    context = ssl.create_default_context(cafile=cafile)

    @art.rollout
    def agent():
        if how == "ssl socket":
            import socket

            with context.wrap_socket(socket.create_connection((where.hostname, where.port), timeout=30),
                                     server_hostname=where.hostname) as s:
                s.sendall(head)
                return s.recv(12)
        return asyncio.run(asyncio_post(where.hostname, where.port, head, ssl=context))

    before = len(lines)
    t = agent.collect_sync()
    assert t.outcome == b"HTTP/1.1 200" and lines[before:] == [b"POST /v1/chat/completions HTTP/1.1"]
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]
    assert f"POST https://{where.netloc}/v1/chat/completions" in warning


# -- a call made while a patched call runs is a call of its own --------------------------------

def watched_call(server, http_client):
    """The trajectory of a rollout that makes one call, "watched", through ``http_client``."""
    from openai import OpenAI

    watched = OpenAI(base_url=server.base_url, api_key="k", http_client=http_client)

    @art.rollout
    def agent() -> str:
        return watched.chat.completions.create(model="m", messages=[{"role": "user", "content": "watched"}]) \
            .choices[0].message.content

    t = agent.collect_sync()
    assert t.outcome == "echo: watched"
    return t


def test_a_call_an_event_hook_makes_is_a_call_of_its_own(server, sync_client):
    import httpx

    def hook(request):
        if b"watched" in request.content:
            sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "from the hook"}])
            httpx.post(server.base_url + "/chat/completions", content=body(), timeout=30)  # not patched: reported

    t = watched_call(server, httpx.Client(event_hooks={"request": [hook]}))
    # the hook's call was sent unrecorded and unreported before, as part of the watched call
    assert [c.messages[0]["content"] for c in t.calls] == ["watched", "from the hook"]
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]
    assert "through a httpx client" in warning


def test_a_call_an_auth_flow_makes_is_a_call_of_its_own(server, sync_client):
    """An httpx auth flow is the agent's code too, run inside ``send`` (a patched call's
    request passes the sentinel at once only where no hook or auth flow runs on its way)."""
    import httpx

    class Signed(httpx.Auth):
        def auth_flow(self, request):
            if b"watched" in request.content:
                sync_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "from the auth"}])
            yield request

    t = watched_call(server, httpx.Client(auth=Signed()))
    assert [c.messages[0]["content"] for c in t.calls] == ["watched", "from the auth"]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_strict_refusal_reaches_the_agent_as_capture_error(server, mode):
    """On openai 2.x the client took the refusal for a broken connection: two retries with
    back-off, then APIConnectionError."""
    import openai

    sent = []

    class Counting(openai.OpenAI if mode == "sync" else openai.AsyncOpenAI):
        def _build_request(self, *args, **kwargs):  # every try, retries included
            sent.append(1)
            return super()._build_request(*args, **kwargs)

    client = Counting(base_url=server.base_url, api_key="k")

    @art.rollout
    async def agent() -> str:
        try:
            if mode == "sync":
                client.post("/chat/completions", body={"model": "m", "messages": USER}, cast_to=object)
            else:
                await client.post("/chat/completions", body={"model": "m", "messages": USER}, cast_to=object)
        except art.CaptureError:
            return "refused"
        return "sent"

    before = len(server.requests)
    art.configure(strict_capture=True)
    try:
        t = await agent.collect()
    finally:
        art.configure(strict_capture=None)
    assert t.error is None and t.outcome == "refused"  # APIConnectionError on openai 2.x before
    assert len(sent) == 1 and len(server.requests) == before  # tried once: no retries of a refusal


# -- HTTP/2 and websockets ---------------------------------------------------------------------

def test_an_http2_request_is_reported_before_its_frames_are_sent(server):
    """httpx speaking HTTP/2 with prior knowledge: its frames are binary (no socket can read
    them), but httpx's sentinel judges the request before its transport sends it. The listener
    only takes the connection's first bytes: the HTTP/2 preface, proof of what went out."""
    import socket
    import threading

    import httpx

    pytest.importorskip("h2")  # httpx's HTTP/2 (httpx[http2])
    listener = socket.create_server(("127.0.0.1", 0))
    port, first = listener.getsockname()[1], []

    def take() -> None:
        conn, _ = listener.accept()
        with conn:
            first.append(conn.recv(24))

    taker = threading.Thread(target=take, daemon=True)
    taker.start()

    @art.rollout
    def agent() -> str:
        with httpx.Client(http1=False, http2=True, timeout=5) as c:
            try:
                c.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=body())
            except httpx.HTTPError as e:  # the listener speaks no HTTP/2 back
                return type(e).__name__
        return "answered"

    t = agent.collect_sync()
    taker.join(10)
    listener.close()
    assert first and first[0].startswith(b"PRI * HTTP/2.0")  # HTTP/2 on the wire
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]
    assert f"POST http://127.0.0.1:{port}/v1/chat/completions" in warning and "httpx" in warning


def test_a_realtime_api_session_is_reported_as_escaping():
    """The Realtime API speaks over a websocket, whose messages artsdk does not record: opening
    one inside a rollout is reported (refused under strict capture), not silently unrecorded.
    (Its own event loop: a refusal inside asyncio's transport reaches the loop's exception
    handler as well as the rollout, as it would in a program.)"""
    import inspect

    websockets = pytest.importorskip("websockets", minversion="13")  # the openai client's realtime extra
    from openai import AsyncOpenAI

    opened = []

    async def handler(ws) -> None:
        opened.append(ws.request.path)
        await ws.send('{"type": "session.created", "event_id": "e1", "session": {}}')
        await ws.wait_closed()

    async def both() -> tuple:
        async with websockets.serve(handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            client = AsyncOpenAI(api_key="k", websocket_base_url=f"ws://127.0.0.1:{port}/v1")

            if not hasattr(client, "realtime"):
                pytest.skip("this openai client has no client.realtime")
            once = {"max_retries": 0} if "max_retries" in inspect.signature(client.realtime.connect).parameters else {}

            @art.rollout
            async def voice() -> str:
                async with client.realtime.connect(model="gpt-realtime", **once) as conn:
                    event = await conn.recv()
                return event.type

            reported = await voice.collect()
            art.configure(strict_capture=True)
            try:
                refused = await voice.collect()
            finally:
                art.configure(strict_capture=None)
            return port, reported, refused

    port, t, refused = asyncio.run(both())
    assert t.error is None and t.outcome == "session.created" and opened[0] == "/v1/realtime?model=gpt-realtime"
    (warning,) = [w for w in t.warnings if w.startswith(ESCAPED)]
    assert f"GET ws://127.0.0.1:{port}/v1/realtime" in warning and "websocket" in warning
    assert refused.error is not None and refused.error.type == "CaptureError" and len(opened) == 1  # never opened
