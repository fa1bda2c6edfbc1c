"""The default pair's draft head, its forward on the fused C++ call (`drafters/fused.py`) against the lean stock layers,
in one process: one tree batch of 1 / 4 / 8 rows over a 300-token cache, warm and after 64 MB of other reads (as a call
meets it after the target's forward), medians of 60 calls, each variant twice interleaved; and the largest relative
difference between the two paths' features. `--live CATEGORY`: instead, treegraft on the bench suite's prompts of
that category (64 new tokens, the engine warmed and calibrated first), each path twice, alternating, with a head
step's parts timed as they run (the forward, the scores, the layout, grafting). Run alone on the host (it times calls).

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_forward_ab.py
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_forward_ab.py --live chat
"""
import argparse
import functools
import time
from collections import Counter, defaultdict

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


def live(category: str) -> None:
    """Treegraft's generations of one category, fused and lean alternately: ms per head step and per part."""
    from treegraft.bench import warm_up
    from treegraft.config import GenerationConfig
    from treegraft.drafters import graft, head as head_module
    from treegraft.engine import Engine
    from treegraft.methods import MethodSpec
    from treegraft.prompts import load_prompts, select

    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine = Engine(load_pair_models(pair, "float32"))
    ms, calls = defaultdict(float), Counter()
    for owner, name, label in ((graft.MidGrafter, "step", "step"), (graft.MidGrafter, "_graft", "graft"),
                               (head_module.HeadDrafter, "_forward", "forward"),
                               (head_module.HeadDrafter, "_scores", "scores"),
                               (head_module.HeadDrafter, "_layout", "layout")):
        def timed_part(*args, _f=getattr(owner, name), _label=label, **kwargs):
            t = time.perf_counter()
            out = _f(*args, **kwargs)
            ms[_label] += 1000 * (time.perf_counter() - t)
            calls[_label] += 1
            return out
        setattr(owner, name, functools.wraps(getattr(owner, name))(timed_part))
    head, fused = engine.mid.head, engine.mid.head.fused
    prompts = [p for p in select(load_prompts("bench"), per_category=4) if p.category == category]
    gen = GenerationConfig(max_new_tokens=64)
    state = warm_up(engine, engine.encode(prompts[0].messages), pair.drafting, gen)
    print(f"treegraft on {len(prompts)} {category} prompts x 64 tokens; ms per head step (its parts)")
    for run in range(4):
        head.fused = fused if run % 2 == 0 else None
        ms.clear()
        calls.clear()
        for p in prompts:
            engine.restore(state)
            engine.generate(engine.encode(p.messages), MethodSpec("treegraft"), pair.drafting, gen)
        steps = max(calls["step"], 1)
        print(f"{head.path:6s} step {ms['step'] / steps:.2f}  " + "  ".join(
            f"{k} {ms[k] / steps:.2f}" for k in ("forward", "scores", "layout", "graft")) + f"  ({steps} steps)")
    head.fused = fused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--live", metavar="CATEGORY", help="time head steps in treegraft's generations of this category")
    args = ap.parse_args()
    if args.live:
        return live(args.live)
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
