"""Where rows are processed, glibc's allocator keeps freed blocks for the next row (data/processing/heap.py): memory
freed by one row is not given back to the kernel and faulted in again by the next, unless the user set the
allocator's settings, which are then left alone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_pipes.data.processing import heap

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")

# Rounds of three 24 MiB blocks allocated, written and freed on the main thread. At glibc's defaults the first free
# raises the mmap threshold to 24 MiB and the trim threshold to 48 MiB: the 72 MiB freed at the heap's top goes back
# to the kernel every round, and every round faults it in again. heap.py is loaded alone (no torch): a fresh process
# costs a tenth of a second.
ROUNDS = """
import ctypes, importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("heap", sys.argv[1]); heap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heap)
kept = heap.keep_freed_memory() if sys.argv[2] == "keep" else False
libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def one_round():
    blocks = [libc.malloc(24 << 20) for _ in range(3)]
    for block in blocks:
        libc.memset(block, 1, 24 << 20)
    for block in blocks:
        libc.free(block)
measured = int(sys.argv[3])
for _ in range(2 if measured else 0):
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(measured):
    one_round()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def rounds(mode: str, measured: int = 4, **env: str) -> dict:
    """``kept`` (what keep_freed_memory said, in a fresh process) and the page faults of ``measured`` rounds after
    two to warm up (none at all with ``measured`` 0: where only ``kept`` is asked)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"} | env
    done = subprocess.run([sys.executable, "-c", ROUNDS, str(Path(heap.__file__)), mode, str(measured)], env=environ, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_freed_blocks_stay_for_the_next_round_instead_of_being_faulted_in_again():
    default, kept = rounds("default"), rounds("keep")
    pages = 4 * 3 * (24 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert kept["kept"] and kept["faults"] < pages // 20  # the same memory, used again
    assert default["faults"] > pages // 2  # at glibc's defaults it is given back and faulted in every round


@pytest.mark.parametrize("env", [{"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, {"MALLOC_TRIM_THRESHOLD_": "0"},
                                 {"MALLOC_ARENA_MAX": "2"}])
def test_allocator_settings_the_user_made_are_left_alone(env):
    assert heap.user_set(env)
    assert not rounds("keep", 0, **env)["kept"]  # the flag alone: the rounds' faults are the test above's


def test_a_processor_opened_sets_them_and_unrelated_tunables_do_not_count_as_the_users():
    assert not heap.user_set({"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "PATH": "/bin"})
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.data.processing.processor import load_processor

    load_processor(default_processor_path(), 512)
    assert heap._done.get(os.getpid()) is (not heap.user_set(os.environ))
