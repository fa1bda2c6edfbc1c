"""Could a per-request track record tell when the head pays? On collected rounds (all 2^D schedules per round),
replay simple history rules against all-small, with modelled times (`replay.modelled`):
  - call the head with schedule S when the n-gram drafter's mean A over the prompt's earlier collected rounds is
    below x (it finds little to copy on this request);
  - call it with S when S had paid, in hindsight, on the prompt's earlier rounds (mean gain over all-small > x);
and how well each recorded scheduler input, alone, separates the rounds where one call at step k pays from the
rest (ROC AUC; 0.5 = no better than chance). docs/scheduler.md ("the hindsight ceiling") quotes the result.

    PYTHONPATH=. .venv/bin/python scripts/history_rules.py docs/bench/sched9/data.jsonl.gz
"""
import sys
from collections import defaultdict

import numpy as np

from treegraft.scheduler.costs import CostProfile
from treegraft.scheduler.features import TREE_CANDIDATES, context_names
from treegraft.scheduler.replay import modelled
from treegraft.scheduler.train import read_dataset

SMALL = (0, 0, 0, 0, 0)
SCHEDULES = [(1, 0, 0, 0, 0), (0, 1, 0, 0, 0), (1, 0, 1, 0, 0), (0, 0, 0, 0, 1)]


def main(path: str) -> None:
    recs = read_dataset(path)
    rounds = modelled(recs, CostProfile.of_records(recs))
    by_prompt = defaultdict(list)
    for r in rounds:
        by_prompt[r["prompt_id"]].append(r)
    for rs in by_prompt.values():
        rs.sort(key=lambda r: r["round"])
    traj = lambda r, s: next(t for t in r["trajectories"] if tuple(t["schedule"]) == s)  # noqa: E731
    rate = lambda ts: sum(t["A"] + 1 for t in ts) / sum(t["t_draft"] + t["t_verify"] for t in ts)  # noqa: E731
    base = rate([traj(r, SMALL) for r in rounds])
    gain = lambda r, s: ((traj(r, s)["A"] - traj(r, SMALL)["A"])  # noqa: E731
                         - base * (traj(r, s)["t_draft"] + traj(r, s)["t_verify"]
                                   - traj(r, SMALL)["t_draft"] - traj(r, SMALL)["t_verify"]))
    print(f"{len(rounds)} rounds of {len(by_prompt)} prompts; each rule's throughput / all-small's (rounds it calls)")
    for s in SCHEDULES:
        for name, signal, cuts, below in (
                ("n-gram mean A <", lambda rs, i: np.mean([traj(q, SMALL)["A"] for q in rs[:i]]), [0.5, 1.0, 1.5, 2.0], True),
                ("earlier gain >", lambda rs, i, s=s: np.mean([gain(q, s) for q in rs[:i]]), [-0.25, 0.0, 0.25], False)):
            cells = []
            for x in cuts:
                picked, n = [], 0
                for rs in by_prompt.values():
                    for i, r in enumerate(rs):
                        use = i > 0 and ((signal(rs, i) < x) if below else (signal(rs, i) > x))
                        n += use
                        picked.append(traj(r, s) if use else traj(r, SMALL))
                cells.append(f"{x:g}: {rate(picked) / base:.3f} ({n})")
            print(f"  {s} when {name} " + ", ".join(cells))
    names = list(TREE_CANDIDATES) + context_names(len(SMALL))
    for k in (1, 2, 3):
        s = tuple(int(j == k - 1) for j in range(len(SMALL)))
        x = np.array([traj(r, SMALL)["features"][k - 1] for r in rounds])
        pays = np.array([gain(r, s) > 0 for r in rounds])
        aucs = sorted(((max(a, 1 - a), n) for n, col in zip(names, x.T) if col.std() > 0
                       for a in [auc(col, pays)]), reverse=True)
        print(f"one call at step {k} pays on {pays.mean():.2f} of the rounds; inputs by AUC: "
              + ", ".join(f"{n} {a:.2f}" for a, n in aucs[:6]))


def auc(x: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive's x > a negative's x), ties at random order (Mann-Whitney)."""
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    n1, n0 = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n1 * (n1 - 1) / 2) / (n1 * n0))


if __name__ == "__main__":
    main(sys.argv[1])
