"""Repeat the load-time calibration of T(n) (`Pruner.calibrate`) on one loaded engine, alternating 3 and 5 passes,
and print each repeat's B_ver, thread count, T(1) / T(8) / T(16) and T(8) / T(1): how far the calibration itself
moves between back-to-back repeats in one process, apart from what moves between processes and minutes.

    PYTHONPATH=. .venv/bin/python scripts/calibration_repeats.py [REPEATS]
"""
import sys

import numpy as np

from treegraft.config import load_pair
from treegraft.engine import Engine, thread_candidates
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts
from treegraft.prune import Pruner


def main(repeats: int = 6) -> None:
    pair = load_pair("default")
    engine = Engine(load_pair_models(pair, "float32"))
    d = pair.drafting
    ids = engine.encode(load_prompts("bench")[0].messages)
    seen: dict[int, list] = {3: [], 5: []}
    print("passes B_ver threads T(1) T(8) T(16) T(8)/T(1)")
    for _ in range(repeats):
        for passes in seen:
            p = Pruner()
            p.calibrate(engine.target, ids, d.budget, d.verify_cost_cap, passes=passes,
                        threads=thread_candidates(engine.device))
            ms = p.verify_cost.ms  # by nodes (tokens - 1)
            seen[passes].append((p.host_b, ms[7] / ms[0]))
            print(passes, p.host_b, p.threads, *(round(ms[n], 1) for n in (0, 7, 15)), round(ms[7] / ms[0], 2),
                  flush=True)
    for passes, rows in seen.items():
        print(f"{passes} passes: B_ver {[b for b, _ in rows]}, T(8)/T(1) median {np.median([r for _, r in rows]):.2f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:2]))
