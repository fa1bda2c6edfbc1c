"""A busy host on demand: `bench --background-load N` runs N CPU-bound processes beside the benchmark, so a
quiet host and a busy one (a shared Space, a laptop with a browser open) are measured by the same command."""
from __future__ import annotations

import multiprocessing as mp
from contextlib import contextmanager
from typing import Iterator


def _spin() -> None:  # one core, busy until terminated
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


@contextmanager
def background_load(n: int) -> Iterator[list]:
    """Run n busy processes for the duration of the block (0: none)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=5)
