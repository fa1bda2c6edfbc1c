"""A host's step costs, and collected rounds re-timed under other costs (a scheduler that transfers).

Collection (train.collect) records, for every schedule of a round, A, each draft step's
time, the verification time and how many nodes were verified. A depends on the models
and the text; the times depend on the host and the dtype. A `CostProfile` is what a
host measures: T(n), the verification time of n nodes (the pruner's calibration at
load), and the mid's and the n-gram's step times. `retime` rescales a collected round
from the profile it was collected under to another one: each draft step's time by the ratio
of that drafter's step costs, the verification by T'(n) / T(n) at the round's own n,
and the timing inputs of the scheduler (t_target_ms, t_mid_ms, their log ratio and
verify_growth) as that host would have measured them. A is kept: the cost-aware cut
chose n under the collection's costs (a documented approximation).

Training on rounds re-timed under many profiles (`jittered`) teaches g_psi how the
margin moves with the costs it reads at run time, so one shipped file decides for
hosts and dtypes it was never collected on.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from .features import TREE_CANDIDATES, context_names

GROWTH_N = 8  # verify_growth = log T(GROWTH_N) / T(0), as VerifyCost.growth


@dataclass
class CostProfile:
    name: str
    verify_ms: dict[int, float]  # T(n): verification ms for n non-root nodes
    mid_ms: float  # one mid step
    small_ms: float  # one n-gram step

    def T(self, n) -> np.ndarray:
        keys = np.array(sorted(self.verify_ms))
        return np.interp(n, keys, np.maximum.accumulate([self.verify_ms[k] for k in keys]))

    @property
    def growth(self) -> float:
        return float(math.log(self.T(GROWTH_N) / self.T(0)))

    def scaled(self, name: str, target: float = 1.0, mid: float = 1.0, steepness: float = 1.0) -> "CostProfile":
        """Another host: T scaled by `target` at n = 0 and its growth T(n) / T(0) raised to `steepness`."""
        t0 = self.T(0)
        ms = {n: float(target * t0 * (self.T(n) / t0) ** steepness) for n in self.verify_ms}
        return CostProfile(name, ms, self.mid_ms * mid, self.small_ms)

    def to_json(self) -> dict:
        return {"name": self.name, "verify_ms": {str(k): v for k, v in self.verify_ms.items()},
                "mid_ms": self.mid_ms, "small_ms": self.small_ms}

    @classmethod
    def from_json(cls, d: dict) -> "CostProfile":
        return cls(d["name"], {int(k): float(v) for k, v in d["verify_ms"].items()}, float(d["mid_ms"]),
                   float(d["small_ms"]))

    @classmethod
    def of_records(cls, records: list[dict], name: str = "collected") -> "CostProfile":
        """The profile a dataset was collected under: its T(n) and median step times."""
        curves = [{int(n): t for n, t in r["verify_ms"].items()} for r in records if r.get("verify_ms")]
        if not curves:
            raise ValueError("these records carry no verification cost curve (collected before re-timing existed)")
        keys = sorted({n for c in curves for n in c})
        ms = {n: float(np.median([c[n] for c in curves if n in c])) for n in keys}
        steps = [(a, t) for r in records for tr in r["trajectories"] for a, t in zip(tr["schedule"], tr["step_s"])]
        mid = [1000 * t for a, t in steps if a]
        small = [1000 * t for a, t in steps if not a]
        return cls(name, ms, float(np.median(mid)), float(np.median(small)))


def measure(engine, prompt_ids: list[int], drafting, name: str) -> CostProfile:
    """This host's profile for the engine's pair and dtype: T(n) by the pruner's calibration (up to B_ver),
    the mid's and the n-gram's step times from one short all-mid and one all-small generation."""
    from ..config import GenerationConfig
    from ..methods import MethodSpec

    engine.pruner.calibrate(engine.target, prompt_ids, drafting.budget)
    gen = GenerationConfig(max_new_tokens=24)
    steps = {}
    for method in ("all-mid", "all-small"):
        res = engine.generate(prompt_ids, MethodSpec(method), drafting, gen)
        steps[method] = float(np.median([1000 * st.draft_s for r in res.rounds for st in r.steps]))
    return CostProfile(name, dict(engine.pruner.verify_cost.ms), steps["all-mid"], steps["all-small"])


def retime(records: list[dict], source: CostProfile, dest: CostProfile) -> list[dict]:
    """The records as if collected on `dest` (see the module docstring); `source` is where they were."""
    n_tree = len(TREE_CANDIDATES)
    out = copy.deepcopy(records)
    verified = [t["verified"] for r in records for t in r["trajectories"]]
    n_typical = float(np.median(verified)) if verified else 0.0
    r_target = float(dest.T(n_typical) / source.T(n_typical))
    r_mid, r_small = dest.mid_ms / source.mid_ms, dest.small_ms / source.small_ms
    for rec in out:
        rec["profile"] = dest.name
        rec["verify_ms"] = {str(k): v for k, v in dest.verify_ms.items()}
        for tr in rec["trajectories"]:
            steps = [t * (r_mid if a else r_small) for a, t in zip(tr["schedule"], tr["step_s"])]
            tr["t_draft"] += float(sum(steps) - sum(tr["step_s"]))  # the rest (scheduler, glue) is kept
            tr["step_s"] = steps
            tr["t_verify"] *= float(dest.T(tr["verified"]) / source.T(tr["verified"]))
            for feats in tr["features"]:
                retime_context(feats, n_tree, len(tr["schedule"]), r_target, r_mid, dest.growth - source.growth)
    return out


def retime_context(feats: list[float], n_tree: int, depth: int, r_target: float, r_mid: float,
                   d_growth: float) -> None:
    """The timing inputs of one recorded feature vector, in place, as the other host would measure them."""
    names = context_names(depth)
    at = {n: n_tree + names.index(n) for n in ("t_target_ms", "t_mid_ms", "log_t_ratio", "verify_growth")}
    feats[at["t_target_ms"]] *= r_target
    feats[at["t_mid_ms"]] *= r_mid
    if r_target != 1.0 or r_mid != 1.0:
        feats[at["log_t_ratio"]] = math.log(max(feats[at["t_target_ms"]], 1e-3) / max(feats[at["t_mid_ms"]], 1e-3))
    if len(feats) == n_tree + len(names):  # rows recorded with verify_growth
        feats[at["verify_growth"]] += d_growth


def jittered(base: CostProfile, n: int, seed: int = 0) -> list[CostProfile]:
    """n hosts around `base`: target cost x [0.4, 2.5], mid cost x [0.3, 3], cost growth ^ [0.5, 2.5]."""
    rng = np.random.default_rng(seed)
    draw = lambda lo, hi: float(np.exp(rng.uniform(np.log(lo), np.log(hi))))  # noqa: E731
    return [base.scaled(f"jitter{i}", draw(0.4, 2.5), draw(0.3, 3.0), draw(0.5, 2.5)) for i in range(n)]
