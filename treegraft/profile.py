"""Where a round's time goes: model forwards vs the engine's own bookkeeping.

A `Profile` adds wall time to named parts; parts are leaf timers (never nested).
`FORWARD_PARTS` are model time; `BOOKKEEPING_PARTS` are the engine's own work
(tree ops and pools, n-gram lookups, the scheduler, pruning, mask building,
acceptance, KV compaction, trace records). Whatever a round spends outside every
part (Python glue between them) is reported as `other`.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .kv import timed

FORWARD_PARTS = ("target_forward", "mid_forward")
BOOKKEEPING_PARTS = ("tree", "ngram", "scheduler", "prune", "mask", "accept", "kv", "trace", "other")


class Profile:
    def __init__(self, device: torch.device):
        self.device = device
        self.ms: dict[str, float] = {}

    @contextmanager
    def part(self, name: str):
        t0 = timed(self.device)
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + 1000 * (timed(self.device) - t0)

    def take(self, wall_s: float) -> dict[str, float]:
        """This round's parts in ms (with `other` = wall - parts), and start afresh."""
        out, self.ms = self.ms, {}
        out["other"] = max(0.0, 1000 * wall_s - sum(out.values()))
        return out


def overhead_share(profile_ms: dict[str, float]) -> float:
    """Bookkeeping time / round time."""
    total = sum(profile_ms.values())
    return sum(v for k, v in profile_ms.items() if k not in FORWARD_PARTS) / total if total else 0.0
