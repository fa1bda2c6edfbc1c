"""The default pair's head: its Linear layers (fuse aside) and its scorer rows on each CPU path, warm (the weights
in cache, as a one-layer drafter used to be timed at load) and cold (after writing through 96 MB of other memory, as a
call meets them after the target's forward). Median ms of 30 calls per path and row count, then the paths the load
chose (`cpu_kernels`, timed cold for a drafter). Run alone on the host.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/cold_paths.py
"""
import time

import numpy as np
import torch

from treegraft import cpu_kernels as ck
from treegraft.config import DEFAULT_MODELS_YAML, load_pair
from treegraft.engine import Engine
from treegraft.models import load_pair_models

PATHS = ("stock", "packed16", "packed16f", "packed16h", "packed8h")


def median_ms(fn, cold: bool, other: torch.Tensor, calls: int = 30) -> float:
    times = []
    for _ in range(calls):
        if cold:
            other.add_(1.0)  # writes through every byte: the caches hold this now
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


@torch.no_grad()
def main() -> None:
    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine = Engine(load_pair_models(pair, "float32"))
    head, scorer = engine.mid.head, engine.mid.scorer
    layers = [m for name, m in head.named_modules() if isinstance(m, torch.nn.Linear) and name != "fuse"]
    for m in layers + [scorer]:  # every packed copy, whichever the load kept
        for path in ("packed16", "packed16h", "packed8h"):
            k = ck.PACKED_KERNELS[path]
            if k.ops() is not None and ck.packable(m, k.block) and getattr(m, k.attr, None) is None:
                ck._pack(m, path)
    other = torch.zeros(96 << 18)  # 96 MB
    for rows in (1, 2, 4, 6, 8):
        print(f"{rows} rows")
        for group, mods in (("layers", layers), ("scorer", [scorer])):
            x = {m: torch.randn(rows, m.in_features) for m in mods}
            for path in PATHS:
                k = ck.PACKED_KERNELS.get(path)
                if k is not None and k.ops() is None:
                    continue  # not built on this host
                fn = lambda: [ck.run_path(m, path, x[m], ck.PREFETCH[0]) for m in mods]  # noqa: E731
                fn()
                warm, cold = median_ms(fn, False, other), median_ms(fn, True, other)
                print(f"  {group}: {path:9s} warm {warm:.3f}  cold {cold:.3f}")
    print("chosen at load: layers", head.kernel_table.body, "scorer", scorer.kernel_table.body)


if __name__ == "__main__":
    main()
