import importlib.util
import os
import sys
from pathlib import Path

# litellm fetches a model price list from the internet at import unless told not to
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOG", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from artsdk.mock_server import MockServer  # noqa: E402


# the local backend's inference engines, for tests that run against each
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (make setup-vllm)")
ENGINES = ["builtin", pytest.param("vllm", marks=needs_vllm)]

# the device the training tests run on: "cuda" on a GPU machine (bench/gpu_check.sh); they
# train in fp32 unless a test names bf16
DEVICE = os.environ.get("ARTSDK_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def server():
    """A real OpenAI-compatible HTTP server on 127.0.0.1 (artsdk/mock_server.py)."""
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
    # finalize what the test left behind (an unclosed async client, say) now, not in the
    # middle of a later test running on another event loop
    import gc

    gc.collect()
    if "litellm" in sys.modules:
        # litellm caches async HTTP clients across calls; each test has its own event loop,
        # and a client from a closed loop fails with "Event loop is closed"
        sys.modules["litellm"].in_memory_llm_clients_cache.flush_cache()



@pytest.fixture
def anyio_backend():
    return "asyncio"
