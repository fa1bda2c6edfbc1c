"""Speedups per method from a bench results.csv (all rows, the first 2 prompts per category, the rest) and
per-row paired ratios of wall time against a base method (end to end and after the prefill), with 95% bootstrap
intervals.

    PYTHONPATH=. .venv/bin/python scripts/paired_ratios.py docs/bench/draftb-ab/results.csv all-small
"""
import csv
import sys

import numpy as np

from treegraft.bench import bootstrap_ci, paired


def seen(row: dict) -> bool:
    """The first 2 prompts of each category (used in earlier sessions' tuning)."""
    return int(row["prompt_id"].split("-")[-1]) <= 2


def main(path: str, base: str | None) -> None:
    rows = list(csv.DictReader(open(path)))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        speedup = [float(r["speedup"]) for r in mine]
        lo, hi = bootstrap_ci(speedup)
        part = {k: np.mean([float(r["speedup"]) for r in mine if seen(r) == k]) for k in (True, False)}
        exact = all(r["exact"] == "True" for r in mine)
        print(f"{m:28s} {np.mean(speedup):.2f}x ({lo:.2f}-{hi:.2f})  first 2 {part[True]:.2f}  "
              f"next {part[False]:.2f}  exact {exact}")
    if base:  # the bench report's own pairing (`bench.paired`), for results files written before it had one
        for r in rows:
            r["wall_s"], r["prefill_s"] = float(r["wall_s"]), float(r["prefill_s"])
        for name, groups in paired(rows, (base,)).items():
            a = groups["all"]
            print(f"paired {name}: {a['ratio']:.3f}x ({a['ci95'][0]:.3f}-{a['ci95'][1]:.3f}); after the prefill "
                  f"{a['decode']:.3f}x ({a['decode_ci95'][0]:.3f}-{a['decode_ci95'][1]:.3f})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
