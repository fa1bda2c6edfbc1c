"""How close the AVX-512 packed kernel runs to the core's arithmetic: two 1,536 x 576 fp32 layers in cache, each path
at 1-32 rows on one and on two torch threads, median of 200 calls, in GFLOP/s. Run alone on the host.

    PYTHONPATH=. .venv/bin/python scripts/kernel_gflops.py
"""
import time

import numpy as np
import torch

from treegraft import cpu_kernels as ck


@torch.no_grad()
def main() -> None:
    if ck.packed16_ops() is None:
        raise SystemExit("the AVX-512 kernel is not built on this host: " + ck.packed_unavailable())
    torch.manual_seed(0)
    layers = [torch.nn.Linear(576, 1536, bias=False) for _ in range(2)]
    for m in layers:
        ck._pack(m, "packed16")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in (1, 8, 12, 16, 24, 32):
            x = torch.randn(rows, 576)
            for path in ("packed16", "packed16f", "stock"):
                fn = lambda: [ck.run_path(m, path, x, ck.PREFETCH[1]) for m in layers]  # noqa: E731
                for _ in range(20):
                    fn()
                times = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                t = float(np.median(times)) / len(layers)
                print(f"threads {threads} rows {rows:2d} {path:9s} {1e3 * t:.3f} ms a layer "
                      f"{2 * rows * 576 * 1536 / t / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
