"""The local backend keeps glibc's malloc to few arenas, so memory one of its threads frees
another reuses (backends/local/heap.py), and a training step lets go of what only serving
holds -- the merged copy of the adapted layers and the prefix cache -- while it trains.
Arenas are counted in a fresh process with glibc's own report (malloc_info)."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
from backends.local import heap  # noqa: E402

needs_glibc = pytest.mark.skipif(heap._glibc() is None, reason="the C library is not glibc")

COUNT_ARENAS = textwrap.dedent("""
    import ctypes, ctypes.util, sys, tempfile, threading
    import torch
    from backends.local import LocalBackend

    LocalBackend(device="cpu", home=tempfile.mkdtemp(), malloc_arenas=int(sys.argv[1]))

    def work():  # what the engine's and the trainer's threads do: tensors made and let go
        for _ in range(20):
            x = torch.randn(256, 1024)
            del x

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile() as out:
        f = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(f))
        libc.fclose(ctypes.c_void_p(f))
        print(open(out.name).read().count("<heap nr="))
""")


def arenas(limit: int) -> int:
    done = subprocess.run([sys.executable, "-c", COUNT_ARENAS, str(limit)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                            "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@needs_glibc
def test_the_backend_keeps_malloc_to_two_arenas_unless_told_otherwise():
    assert arenas(2) <= 2
    assert arenas(0) > 2  # glibc's own limit: a thread of its own, an arena of its own


def test_a_training_step_lets_go_of_what_serving_holds(tmp_path):
    import anyio

    import artsdk as art
    from backends.local import LocalBackend

    async def main():
        be = LocalBackend(device="cpu", home=str(tmp_path))
        model = art.TrainableModel("h", base_model="tiny", project="p")
        await be.register(model)
        served = be.models["h"]
        engine = served.engine
        from backends.local.engine import Request

        prompt = served.chat.prompt_ids([{"role": "user", "content": "hi"}])
        served.submit(Request(prompt=prompt, max_tokens=4, seed=1)).result(60)
        assert engine.prefix_cache.used > 0  # what serving keeps between requests
        engine.merger.merge("policy")  # a step's adapter merged in, as serving a trained step does
        assert engine.merger.buffers is not None
        with engine.training():
            assert engine.merger.buffers is None and engine.prefix_cache.used == 0
        # serving makes them anew, and answers as before
        again = served.submit(Request(prompt=prompt, max_tokens=4, seed=1)).result(60)
        assert again[0].token_ids
        await be.close()

    anyio.run(main)
