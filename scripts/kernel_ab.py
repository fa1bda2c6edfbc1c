"""A/B of the AVX2 packed kernel at the level of the target's forward: this tree's kernels/packed_gemm.cpp against
another version of it (e.g. `git show REV:treegraft/kernels/packed_gemm.cpp > old.cpp`), in one process, the two
interleaved round by round, on the default pair's target with its load-time routing (fp32).

    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py old.cpp [--rounds 15]

Prints T(n) for n tokens over a 256-token cache, per kernel (median ms, rounds interleaved), and checks that both
give bit-equal logits. Run it alone: it times.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.utils.cpp_extension import load
from transformers import DynamicCache

from treegraft import cpu_kernels
from treegraft.config import load_pair
from treegraft.models import load_pair_models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other version of kernels/packed_gemm.cpp")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", default="1,2,4,6,8,12,16,24,32")
    args = ap.parse_args()
    pair = load_pair_models(load_pair("default"), dtype="float32")
    model, table = pair.target, pair.target.kernel_table
    new = cpu_kernels.packed_ops()
    if new is None:
        raise SystemExit(f"no packed kernel here: {cpu_kernels.packed_unavailable()}")
    old = load("treegraft_packed_gemm_ab_other", [args.old], extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
               extra_ldflags=["-fopenmp"], extra_include_paths=[str(cpu_kernels.SOURCE.parent)])
    torch.manual_seed(0)
    prompt = torch.randint(100, 20000, (1, 256))
    cache = DynamicCache()
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    times = {(k, n): [] for k in ("old", "new") for n in sizes}
    outs = {}

    @torch.no_grad()
    def forward(n: int) -> torch.Tensor:
        ids = torch.randint(100, 20000, (1, n), generator=torch.Generator().manual_seed(n))
        pos = torch.arange(256, 256 + n)[None]
        out = model(ids, past_key_values=cache, position_ids=pos, use_cache=True).logits
        cache.crop(-n)  # back to the 256-token prompt
        return out

    for r in range(args.rounds + 1):
        for name, ops in (("old", old), ("new", new)) if r % 2 else (("new", new), ("old", old)):
            cpu_kernels._ops["ops"] = ops
            cpu_kernels.use_cpu_kernels(model, table)  # rebinds every routed product to this module
            for n in sizes:
                t0 = time.perf_counter()
                out = forward(n)
                if r:
                    times[(name, n)].append(1000 * (time.perf_counter() - t0))
                outs[(name, n)] = out
    cpu_kernels._ops["ops"] = new
    for n in sizes:
        assert torch.equal(outs[("old", n)], outs[("new", n)]), f"logits differ at {n} tokens"
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"target forward over a 256-token cache, ms (median of {args.rounds} interleaved rounds); logits bit-equal")
    print("| tokens | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for name in ("old", "new"):
        print(f"| {name} | " + " | ".join(f"{med[(name, n)]:.1f}" for n in sizes) + " |")
        print(f"| {name} / T(1) | " + " | ".join(f"{med[(name, n)] / med[(name, 1)]:.2f}" for n in sizes) + " |")
    print("| new / old | " + " | ".join(f"{med[('new', n)] / med[('old', n)]:.3f}" for n in sizes) + " |")


if __name__ == "__main__":
    main()
