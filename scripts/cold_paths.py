"""The default pair's head: its Linear layers (fuse aside) and its scorer rows on each CPU path, warm (the weights
in cache, as a one-layer drafter used to be timed at load: `cpu_kernels._once_ms`) and cold (`cpu_kernels.cold_clock`,
as a call meets them after the target's forward, and as a drafter's paths are timed at load now). Median ms of 30
calls per path and row count, then the paths the load chose. Run alone on the host.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/cold_paths.py
"""
import numpy as np
import torch

from treegraft import cpu_kernels as ck
from treegraft.config import DEFAULT_MODELS_YAML, load_pair
from treegraft.engine import Engine
from treegraft.models import load_pair_models

PATHS = ("stock", "packed16", "packed16f", "packed16h", "packed8h")


def median_ms(clock, fn, rows: int, path: str, calls: int = 30) -> float:
    return float(np.median([clock(fn, rows, (path, ck.PREFETCH[0])) for _ in range(calls)]))


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
    cold_clock = ck.cold_clock()
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
                warm, cold = median_ms(ck._once_ms, fn, rows, path), median_ms(cold_clock, fn, rows, path)
                print(f"  {group}: {path:9s} warm {warm:.3f}  cold {cold:.3f}")
    print("chosen at load: layers", head.kernel_table.body, "scorer", scorer.kernel_table.body)


if __name__ == "__main__":
    main()
