"""Replaying a policy on collected rounds, and the transfer check across cost profiles.

Every collected round holds all 2^D schedules from one state, each with the features
the policy would have seen before each step. So a policy can be replayed exactly: at
step k, the features of any schedule with the prefix chosen so far are the state;
its decision extends the prefix; after D steps the chosen schedule's A and time are
what a real round would have given (from that state). Throughput over the held-out
rounds, (sum A + 1) / sum t, times T(0) (a plain decoding step's cost on that
profile) estimates the speedup over AR.

`transfer_check` trains, on the same training prompts, one scheduler per cost
profile (that profile's costs alone) and one on the collected costs jittered
(`costs.jittered`: other hosts, never the profiles checked), and replays each on
held-out prompts re-timed under each profile.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..tree import MID
from .costs import CostProfile, jittered, retime
from .features import TREE_CANDIDATES, context_names
from .policy import SchedulerFile
from .value import grouped_folds

Decide = Callable[[list[float], int], int]  # (recorded feature vector, k) -> 0 small / 1 mid


def scheduler_decider(sched: SchedulerFile, depth: int) -> Decide:
    names = context_names(depth)
    tree_idx = [TREE_CANDIDATES.index(n) for n in sched.tree_features]
    ctx_idx = [len(TREE_CANDIDATES) + names.index(n) for n in (sched.context_features or names)]

    def decide(feats: list[float], k: int) -> int:
        z = np.array([feats[i] for i in tree_idx + ctx_idx], np.float32)
        return int(float(sched.g(z[None])[0, 0]) > sched.threshold)

    return decide


def fixed_decider(schedule: tuple[int, ...]) -> Decide:
    return lambda feats, k: schedule[k - 1]


def replay_round(rec: dict, decide: Decide) -> dict:
    """The trajectory a policy picks on one collected round."""
    trajs = {tuple(t["schedule"]): t for t in rec["trajectories"]}
    depth = len(next(iter(trajs)))
    prefix: tuple[int, ...] = ()
    for k in range(1, depth + 1):
        state = next(t for tau, t in trajs.items() if tau[: k - 1] == prefix)
        prefix += (decide(state["features"][k - 1], k),)
    return trajs[prefix]


def replay(records: list[dict], decide: Decide, profile: CostProfile) -> dict:
    """Estimated speedup over AR and the mid-call rate per step of a policy on (re-timed) rounds."""
    picked = [replay_round(r, decide) for r in records]
    tokens = sum(t["A"] + 1 for t in picked)
    seconds = sum(t["t_draft"] + t["t_verify"] for t in picked)
    steps = sum(len(t["schedule"]) for t in picked)
    return {"speedup": tokens / seconds * float(profile.T(0)) / 1000, "mid_rate": sum(sum(t["schedule"])
            for t in picked) / steps}


def transfer_check(records: list[dict], profiles: list[CostProfile], depth: int, features: list[str],
                   n_jitter: int = 8, test_share: float = 0.3, seed: int = 0, log=print) -> dict:
    """{profile: {scheduler: replay figures}} on held-out prompts; schedulers: each profile's own, 'transfer'
    (collected costs + n_jitter jittered hosts), and all-small / all-mid for reference."""
    from .train import train

    groups = np.array([r["prompt_id"] for r in records])
    n_folds = max(2, round(1 / test_share))
    test = grouped_folds(groups, n_folds, seed)[0]
    train_recs = [r for r, t in zip(records, test) if not t]
    test_recs = [r for r, t in zip(records, test) if t]
    source = CostProfile.of_records(records)
    quiet = lambda *a: None  # noqa: E731
    scheds = {f"own ({p.name})": train(train_recs, depth, features=features, profiles=[p], seed=seed, log=quiet,
                                       heldout=False) for p in profiles}
    scheds["transfer"] = train(train_recs, depth, features=features, seed=seed, log=quiet, heldout=False,
                               profiles=[source] + jittered(source, n_jitter, seed))
    out: dict = {}
    for p in profiles:
        held = retime(test_recs, source, p)
        row = {name: replay(held, scheduler_decider(s, depth), p) for name, s in scheds.items()
               if not name.startswith("own") or name == f"own ({p.name})"}
        row["all-small"] = replay(held, fixed_decider((0,) * depth), p)
        row["all-mid"] = replay(held, fixed_decider((MID,) * depth), p)
        out[p.name] = row
        log(f"{p.name}: " + ", ".join(f"{k} {v['speedup']:.3f}x (mid {v['mid_rate']:.2f})" for k, v in row.items()))
    return {"train_prompts": len(set(groups[~test])), "test_prompts": len(set(groups[test])),
            "test_rounds": len(test_recs), "profiles": {p.name: p.to_json() for p in profiles}, "replay": out}
