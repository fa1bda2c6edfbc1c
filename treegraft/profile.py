"""Where a round's time goes: model forwards vs the engine's own bookkeeping, measured at component edges.

Components mark their own work with the `profiled(part)` decorator (the n-gram
index, the tree operations of a draft step, the scheduler, pruning, mask
building, the forwards, acceptance, KV compaction, trace records); the engine
activates its `Profile` around a generation, and the round's code carries no
timing lines. Parts nest: a part's time excludes the parts running inside it
(a small step's "tree" time excludes its "ngram" look-ups), so the parts of a
round add up to at most its wall time. Whatever a round spends outside every part
(Python glue) is reported as `other`. `FORWARD_PARTS` are model time,
`BOOKKEEPING_PARTS` the engine's own work.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .kv import timed

FORWARD_PARTS = ("target_forward", "mid_forward", "mid_prefill")  # mid_prefill: the prompt fed at a first call
BOOKKEEPING_PARTS = ("tree", "ngram", "scheduler", "prune", "mask", "accept", "kv", "trace", "other")

_ACTIVE: ContextVar["Profile | None"] = ContextVar("treegraft_profile", default=None)


class Profile:
    def __init__(self, device: torch.device):
        self.device = device
        self.ms: dict[str, float] = {}
        self._inner: list[float] = []  # time spent in nested parts, per open part

    @contextmanager
    def part(self, name: str):
        """Add this block's exclusive time (minus nested parts) to `name`."""
        t0 = timed(self.device)
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = 1000 * (timed(self.device) - t0)
            inner = self._inner.pop()
            self.ms[name] = self.ms.get(name, 0.0) + elapsed - inner
            if self._inner:
                self._inner[-1] += elapsed

    @contextmanager
    def active(self):
        """Route `profiled` components in this context to this profile."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def take(self, wall_s: float) -> dict[str, float]:
        """This round's parts in ms (with `other` = wall - parts), and start afresh."""
        out, self.ms = self.ms, {}
        out["other"] = max(0.0, 1000 * wall_s - sum(out.values()))
        return out


def profiled(name: str):
    """Decorator: the call's time counts as part `name` of the active profile (none active: no cost)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            profile = _ACTIVE.get()
            if profile is None:
                return fn(*args, **kwargs)
            with profile.part(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
