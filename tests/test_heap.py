"""The local backend keeps glibc's malloc to few arenas, so memory one of its threads frees
another reuses, and gives allocations of 4 MiB or more pages of their own whatever was freed
before (backends/local/heap.py); a training step lets go of what only serving holds -- the
merged copy of the adapted layers and the prefix cache -- while it trains. Arenas and mapped
blocks are counted in a fresh process with glibc's own report (malloc_info)."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
from backends.local import heap  # noqa: E402

needs_glibc = pytest.mark.skipif(heap._glibc() is None, reason="the C library is not glibc")

REPORT = textwrap.dedent("""
    import ctypes, ctypes.util, tempfile

    def malloc_info():
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.fopen.restype = ctypes.c_void_p
        with tempfile.NamedTemporaryFile() as out:
            f = libc.fopen(out.name.encode(), b"w")
            libc.malloc_info(0, ctypes.c_void_p(f))
            libc.fclose(ctypes.c_void_p(f))
            return open(out.name).read()
""")

COUNT_ARENAS = REPORT + textwrap.dedent("""
    import sys, threading
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
    print(malloc_info().count("<heap nr="))
""")

# activations of a row freed, the next row's made: how many of them glibc maps to pages of their own
COUNT_MAPPED = REPORT + textwrap.dedent("""
    import re, sys
    import torch
    from backends.local import LocalBackend

    LocalBackend(device="cpu", home=tempfile.mkdtemp(), malloc_mmap_kb=int(sys.argv[1]))

    def mapped():
        return int(re.search(r'<total type="mmap" count="(\\d+)"', malloc_info()).group(1))

    row = [torch.ones(2**21) for _ in range(8)]  # 8 MiB each
    del row
    before = mapped()
    row = [torch.ones(2**21) for _ in range(8)]
    print(mapped() - before)
""")


def run(script: str, setting: int) -> int:
    done = subprocess.run([sys.executable, "-c", script, str(setting)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                            "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def arenas(limit: int) -> int:
    return run(COUNT_ARENAS, limit)


@needs_glibc
def test_the_backend_keeps_malloc_to_two_arenas_unless_told_otherwise():
    assert arenas(2) <= 2
    assert arenas(0) > 2  # glibc's own limit: a thread of its own, an arena of its own


@needs_glibc
def test_the_backend_maps_large_blocks_to_pages_of_their_own_after_others_were_freed():
    # the next row's 8 MiB activations each mapped, and given back when freed -- not carved
    # from an arena where other rows' leave holes
    assert run(COUNT_MAPPED, 4096) == 8
    # glibc's own threshold rose to the freed blocks' size: the next ones come from an arena
    assert run(COUNT_MAPPED, 0) == 0


def test_a_malloc_setting_that_is_not_a_whole_number_is_refused_by_name(tmp_path):
    import artsdk as art
    from backends.local import LocalBackend

    for bad in (-1, 1.5, True, "1024"):
        with pytest.raises(art.BackendError, match=rf"malloc_mmap_kb={bad!r} must be a whole number >= 0"):
            LocalBackend(device="cpu", home=str(tmp_path), malloc_mmap_kb=bad)


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
