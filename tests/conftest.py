import importlib.util
import os
import sys
from pathlib import Path

# `make test TEST_WORKERS=2` runs the suite in two worker processes (pytest-xdist): each does its
# torch work on one thread, as do the processes it starts, so the two never fight over a core
# (torch's threads spin; two 2-thread processes on 2 cores run several times slower than 1 + 1)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# vLLM's CPU build runs its model in a process of its own beside its engine's, spawned, so that
# it can bind its threads to cores: one more import of vLLM, about 14 s of every start (42 s ->
# 28 s for the tiny model here; SmolLM2 samples about 10% slower unbound). The vLLM the tests
# start runs the model in its engine's process, on the threads OMP_NUM_THREADS gives it: its
# server, adapters, sampling and process group are the ones users get
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# litellm fetches a model price list from the internet at import unless told not to
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOG", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from artsdk.testing.mock_server import MockServer  # noqa: E402
from tests.xdist_groups import pytest_collection_modifyitems  # noqa: E402,F401 - the groups, on pytest 9.2


# tests that never run beside another of their kind: each kind runs in one worker, one test after
# another (`--dist loadgroup`), to bound the load on 2 cores and 24 GB: a Ray instance is a dozen
# processes and gigabytes (the fault tests kill its nodes and ranks), a vLLM server holds
# gigabytes of RAM
on_ray = pytest.mark.xdist_group("ray")
on_vllm = pytest.mark.xdist_group("vllm")

# the local backend's inference engines, for tests that run against each
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (make setup-vllm)")
ENGINES = ["builtin", pytest.param("vllm", marks=[needs_vllm, on_vllm])]

needs_postgres = pytest.mark.skipif(importlib.util.find_spec("pgserver") is None or
                                    importlib.util.find_spec("psycopg") is None,
                                    reason="pgserver / psycopg are not installed (make setup)")


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL server (pgserver's binaries), on a socket in a temporary folder; the
    fixture is the server object (``postgres_url`` makes a fresh database on it)."""
    import pgserver

    srv = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield srv
    srv.cleanup()


@pytest.fixture
def postgres_url(postgres):
    """The SQLAlchemy URL of a new, empty database on the test PostgreSQL server."""
    import uuid

    name = f"t{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {name};")
    return postgres.get_uri(name).replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_postgres)])
def store_url(request, tmp_path):
    """Where a store test keeps its store: an SQLite file, or a database on a real PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    return request.getfixturevalue("postgres_url")


# the device the training tests run on: "cuda" on a GPU machine (bench/gpu_check.sh); they
# train in fp32 unless a test names bf16
DEVICE = os.environ.get("ARTSDK_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def server():
    """A real OpenAI-compatible HTTP server on 127.0.0.1 (artsdk/testing/mock_server.py)."""
    with MockServer() as s:
        yield s


@pytest.fixture
def sync_client(server):
    """An openai client of the scripted server."""
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="k")


@pytest.fixture
async def async_client(server):
    """An async openai client of the scripted server, closed with the test's event loop."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url, api_key="k")
    yield client
    await client.close()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Every test runs in its own folder, so the default store and config are its own."""
    monkeypatch.chdir(tmp_path)
    for k in list(os.environ):
        if k.startswith("ARTSDK_"):
            monkeypatch.delenv(k)
    import artsdk

    artsdk.configure(**{k: None for k in artsdk.Settings.model_fields})
    yield
    artsdk.configure(**{k: None for k in artsdk.Settings.model_fields})
    if "litellm" in sys.modules:
        # litellm caches async HTTP clients across calls; each test has its own event loop,
        # and a client from a closed loop fails with "Event loop is closed"
        sys.modules["litellm"].in_memory_llm_clients_cache.flush_cache()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once a test's fixtures are torn down, finalize what it left behind (an unclosed async
    client, say) now, not in the middle of a later test running on another event loop.

    A full collection walks every object the worker holds: with torch, vLLM and the frameworks
    imported, close to a million, 0.4-0.8 s a test. So what outlives a test is frozen
    (``gc.freeze``) and the next test's collection walks only what that test made; at the end of
    each test file, once its module's fixtures are gone, everything is collected again."""
    import gc

    try:
        return (yield)
    finally:
        if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
            gc.unfreeze()
        gc.collect()
        gc.freeze()



@pytest.fixture
def anyio_backend():
    return "asyncio"
