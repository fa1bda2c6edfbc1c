"""How close the AVX-512 packed kernel runs to the core's arithmetic: two 1,536 x 576 fp32 layers in cache, timed by
the load's own measurement (`cpu_kernels.measure`: every path at every row bucket, each packed path at its best
prefetch distance, the median of interleaved rounds) on one and on two torch threads, in GFLOP/s. Run alone on the
host.

    PYTHONPATH=. .venv/bin/python scripts/kernel_gflops.py
"""
import torch

from treegraft import cpu_kernels as ck

PATHS = ("stock", "packed16", "packed16f")


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
        ms, _ = ck.measure(layers, "body", rounds=21, paths=PATHS)  # {rows: {path: ms a layer}}
        for rows, by_path in ms.items():
            print(f"threads {threads} rows {rows:2d} " + "  ".join(
                f"{p} {t:.3f} ms {2 * rows * 576 * 1536 / t / 1e6:6.1f} GFLOP/s" for p, t in by_path.items()))


if __name__ == "__main__":
    main()
