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


def rate(picked: list[dict]) -> float:
    """Tokens per second of chosen trajectories: (sum A + 1) / sum t."""
    return sum(t["A"] + 1 for t in picked) / sum(t["t_draft"] + t["t_verify"] for t in picked)


def gain(picked: list[dict], lam: float) -> float:
    """sum of A + 1 - lam t: positive where the trajectories beat throughput lam."""
    return sum(t["A"] + 1 - lam * (t["t_draft"] + t["t_verify"]) for t in picked)


def throughput(picked: list[dict], profile: CostProfile) -> dict:
    """Estimated speedup over AR (rate x T(0)) and the mid-call rate per step of chosen trajectories."""
    steps = sum(len(t["schedule"]) for t in picked)
    return {"speedup": rate(picked) * float(profile.T(0)) / 1000,
            "mid_rate": sum(sum(t["schedule"]) for t in picked) / steps, "rounds": len(picked)}


def replay(records: list[dict], decide: Decide, profile: CostProfile) -> dict:
    """Estimated speedup over AR and the mid-call rate per step of a policy on (re-timed) rounds."""
    return throughput([replay_round(r, decide) for r in records], profile)


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


def modelled(records: list[dict], profile: CostProfile) -> list[dict]:
    """The records with every trajectory's time taken from `profile`: each draft step at its drafter's step cost,
    verification at T(verified), the glue (scheduler, bookkeeping) as measured. A hindsight pick among 2^D
    schedules then picks drafting, not the luckiest clock reading."""
    out = []
    for rec in records:
        trajs = []
        for tr in rec["trajectories"]:
            steps = [(profile.mid_ms if a else profile.small_ms) / 1000 for a in tr["schedule"]]
            glue = tr["t_draft"] - sum(tr["step_s"])
            trajs.append({**tr, "step_s": steps, "t_draft": glue + sum(steps),
                          "t_verify": float(profile.T(tr["verified"])) / 1000})
        out.append({**rec, "trajectories": trajs})
    return out


def hindsight(records: list[dict], per: str = "round") -> list[dict]:
    """The trajectories a scheduler knowing every outcome would pick, one schedule per round (`per="round"`) or
    one fixed schedule for all of a prompt's rounds (`per="prompt"`): the choice that maximises throughput over
    all the rounds, (sum A + 1) / sum t (Dinkelbach: with lam the throughput so far, pick the option with the
    largest sum of A + 1 - lam t per group, update lam; it rises to the optimum in a few passes). No scheduler
    with these drafters and costs can beat the per-round pick on these rounds; the per-prompt one is what
    knowing each prompt's best schedule in advance would give (in-sample, so still optimistic)."""
    key = (lambda i, r: i) if per == "round" else (lambda i, r: r["prompt_id"])
    groups: dict = {}
    for i, r in enumerate(records):
        groups.setdefault(key(i, r), []).append(r)
    schedules = [tuple(t["schedule"]) for t in records[0]["trajectories"]]
    options = {g: [[next(t for t in r["trajectories"] if tuple(t["schedule"]) == s) for r in rs] for s in schedules]
               for g, rs in groups.items()}  # group -> per schedule, its rounds' trajectories
    pick = {g: opts[schedules.index((0,) * len(schedules[0]))] for g, opts in options.items()}
    for _ in range(50):
        lam = rate([t for ts in pick.values() for t in ts])
        new = {g: max(opts, key=lambda ts: gain(ts, lam)) for g, opts in options.items()}
        if all(new[g] is pick[g] for g in pick):
            break
        pick = new
    return [t for ts in pick.values() for t in ts]


def held_out_prompt_pick(records: list[dict]) -> list[dict]:
    """For each round, the schedule that was best on the same prompt's other rounds (largest sum of A + 1 -
    lam t there, lam = all-small's throughput): what knowing, from a prompt's other rounds in hindsight, which
    schedule pays on that prompt would give on a round it has not seen. If it is no better than all-small, the
    head's value is round-specific, not something a per-request history could learn."""
    depth = len(records[0]["trajectories"][0]["schedule"])
    lam = rate([replay_round(r, fixed_decider((0,) * depth)) for r in records])
    by_schedule = [{tuple(t["schedule"]): t for t in r["trajectories"]} for r in records]
    picked = []
    for i, r in enumerate(records):
        others = [b for j, (q, b) in enumerate(zip(records, by_schedule)) if q["prompt_id"] == r["prompt_id"] and j != i]
        best = max(by_schedule[i], key=lambda s: gain([b[s] for b in others], lam)) if others else (0,) * depth
        picked.append(by_schedule[i][best])
    return picked


def ceiling(records: list[dict], depth: int, sched: SchedulerFile | None = None,
            mid_scales: tuple[float, ...] = (1.0, 0.5, 0.0)) -> dict:
    """What the mid could add at best on these rounds: for each mid step cost (the collected one x scale), the
    estimated speedup over AR of all-small, all-mid, the given scheduler, each prompt's best schedule on its other
    rounds (`held_out_prompt_pick`) and the two hindsight ceilings (best schedule per prompt, best per round),
    overall and per category, with modelled times (`modelled`). Scale 0 is a free mid call: the head's value
    alone."""
    source = CostProfile.of_records(records)
    cats = sorted({r.get("category", "?") for r in records})
    out: dict = {"profile": source.to_json(), "rounds": len(records), "by_scale": {}}
    for scale in mid_scales:
        prof = source.scaled(f"mid x{scale:g}", mid=scale)
        recs = modelled(retime(records, source, prof), prof)
        rows: dict = {}
        for cat in ["all"] + cats:
            part = [r for r in recs if cat == "all" or r.get("category", "?") == cat]
            row = {"all-small": throughput([replay_round(r, fixed_decider((0,) * depth)) for r in part], prof),
                   "all-mid": throughput([replay_round(r, fixed_decider((MID,) * depth)) for r in part], prof)}
            if sched is not None:
                row["scheduler"] = throughput([replay_round(r, scheduler_decider(sched, depth)) for r in part], prof)
            row["prompt, held out"] = throughput(held_out_prompt_pick(part), prof)
            row["prompt ceiling"] = throughput(hindsight(part, per="prompt"), prof)
            row["ceiling"] = throughput(hindsight(part), prof)
            best = max(row["all-small"]["speedup"], row["all-mid"]["speedup"])
            for c in ("prompt, held out", "prompt ceiling", "ceiling"):
                row[f"{c} / all-small"] = row[c]["speedup"] / row["all-small"]["speedup"]
                row[f"{c} / best single"] = row[c]["speedup"] / best
            rows[cat] = row
        out["by_scale"][f"{scale:g}"] = rows
    return out
