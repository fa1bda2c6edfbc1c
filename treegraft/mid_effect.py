"""What one mid call does to a round: the same rounds drafted with and without it.

At each sampled round of a live generation, the engine drafts and verifies the
round several times from the same state (`Engine.trial_round`: nothing learned,
every cache rolled back): once with small steps only, and once for each step k
with the mid at step k and small steps elsewhere. The accepted length A of each
trial is the target's own verdict on that tree. A mid call that adds evidence
(calibrated scores, tree.py) should not lower A; one that overwrites the n-gram
drafter's scores (the paper's rule) can. `python -m treegraft scheduler
mid-effect` prints the table; tests/test_calibration.py holds the rule to it.
"""
from __future__ import annotations

import numpy as np

from .config import DraftingConfig, GenerationConfig
from .methods import Fixed, MethodSpec


def schedules(depth: int) -> dict[str, tuple[int, ...]]:
    """"none": small steps only; "k=K": the mid at step K only."""
    out = {"none": (0,) * depth}
    for k in range(depth):
        out[f"k={k + 1}"] = tuple(int(i == k) for i in range(depth))
    return out


def mid_effect(engine, prompts: list[list[int]], drafting: DraftingConfig, rounds: int = 6,
               max_new_tokens: int = 96) -> dict:
    """{"A": {schedule: [A per sampled round]}, "rounds": n}: every prompt's first `rounds` rounds (after a
    warm-up round), each drafted under every schedule; the generation itself advances all-small."""
    plans = schedules(drafting.depth)
    got: dict[str, list[int]] = {name: [] for name in plans}
    gen = GenerationConfig(max_new_tokens=max_new_tokens)
    for ids in prompts:
        s = engine.start(ids, MethodSpec("all-small"), drafting, gen)
        engine.speculative_round(s)  # warm the timing estimates and the acceptance record
        s.rounds += 1
        for _ in range(rounds):
            if engine.finished(s):
                break
            for name, tau in plans.items():
                got[name].append(engine.trial_round(s, Fixed(tau)).acc.accepted_tokens)
            engine.speculative_round(s)
            s.rounds += 1
    return {"A": got, "rounds": len(got["none"])}


def summary(result: dict) -> dict[str, float]:
    """Mean A per schedule, and "mid" = the mean over every schedule with a mid call."""
    a = result["A"]
    out = {name: float(np.mean(v)) for name, v in a.items() if v}
    mids = [x for name, v in a.items() if name != "none" for x in v]
    out["mid"] = float(np.mean(mids)) if mids else float("nan")
    return out
