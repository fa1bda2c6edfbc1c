"""The default pair's draft head, its forward on the fused C++ call (`drafters/fused.py`) against the lean stock layers,
in one process: one tree batch of 1 / 4 / 8 rows over a 300-token cache, warm and after 64 MB of other reads (as a call
meets it after the target's forward), medians of 60 calls, each variant twice interleaved; and the largest relative
difference between the two paths' features. Run alone on the host (it times calls).

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_forward_ab.py
"""
import time

import numpy as np
import torch

from treegraft.config import DEFAULT_MODELS_YAML, load_pair
from treegraft.kv import GrowingCache, keep_slots
from treegraft.models import load_pair_models

CACHED, CALLS = 300, 60


@torch.no_grad()
def timed(head, fused, rows: int, cold: bool, junk: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(median ms of a forward of `rows` tree rows over CACHED tokens, the features [1, CALLS * rows, H])."""
    keep, head.fused = head.fused, fused
    cache, g, h = GrowingCache(), torch.Generator().manual_seed(0), head.config.hidden_size
    causal = torch.triu(torch.full((CACHED, CACHED), torch.finfo(torch.float32).min), 1)[None, None]
    head(torch.randn(1, CACHED, h, generator=g), torch.randint(0, 1000, (1, CACHED), generator=g), causal,
         torch.arange(CACHED)[None], cache, True)
    ms, outs = [], []
    for _ in range(CALLS):
        feats, ids = torch.randn(1, rows, h, generator=g), torch.randint(0, 1000, (1, rows), generator=g)
        if cold:
            junk.sum()
        t = time.perf_counter()
        outs.append(head(feats, ids, torch.zeros(1, 1, rows, CACHED + rows), torch.arange(CACHED, CACHED + rows)[None],
                         cache, True))
        ms.append(1000 * (time.perf_counter() - t))
        keep_slots(cache, CACHED)
    head.fused = keep
    return float(np.median(ms)), torch.cat(outs, 1)


def main() -> None:
    head = load_pair_models(load_pair("default", DEFAULT_MODELS_YAML), "float32").mid
    print(f"head path {head.path}; 2 torch threads; {CACHED} cached tokens; medians of {CALLS} forwards, ms")
    if head.fused is None:
        raise SystemExit("the fused forward does not run here")
    junk = torch.randn(16 << 20)  # 64 MB
    for rows in (1, 4, 8):
        for cold in (False, True):
            runs = [timed(head, fused, rows, cold, junk) for _ in range(2) for fused in (None, head.fused)]
            lean, fused = runs[0::2], runs[1::2]
            a, b = lean[0][1], fused[0][1]
            diff = ((a - b).abs().max() / a.abs().max()).item()
            print(f"{rows} rows {'cold' if cold else 'warm'}: lean {lean[0][0]:.3f} / {lean[1][0]:.3f}  "
                  f"fused {fused[0][0]:.3f} / {fused[1][0]:.3f}  relative difference {diff:.1e}")


if __name__ == "__main__":
    main()
