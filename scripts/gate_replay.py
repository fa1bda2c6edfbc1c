"""Replay step-1 rules on measured trial rounds (`scripts/call_trials.py` output): each round's outcome with or without
the call, as the rule decides from the rounds before it (the gate sees only its own estimates of its call rounds).
Prints the mean per-prompt speed against all-small's and the share of rounds called.

    PYTHONPATH=. .venv/bin/python scripts/gate_replay.py artifacts/call_trials-bench.json artifacts/call_trials-unseen.json
"""
import json
import sys
from collections import defaultdict

import numpy as np

from treegraft.scheduler import online
from treegraft.scheduler.online import Yield, YieldGate


def replay(rounds: list[dict], rule) -> tuple[float, float, int]:
    gate, tokens, ms, calls = YieldGate(), 0.0, 0.0, 0
    for r in rounds:
        called = rule(gate)
        key = "call" if called else "small"
        tokens, ms, calls = tokens + r["a_" + key], ms + r["ms_" + key], calls + called
        gate.observe(called, Yield(r["y_a"], r["y_ms"], r["y_a0"], r["y_ms0"]) if called else None)
    return tokens, ms, calls


def main(files: list[str]) -> None:
    prompts = defaultdict(list)
    for f in files:
        for r in json.load(open(f)):
            prompts[(f, r["prompt"])].append(r)
    rules = {"never": lambda g: False, "always": lambda g: True, "gate (bound, Z = %g)" % online.Z: YieldGate.wants_call,
             "gate (mean: Z = 0)": lambda g: g.calls < online.MIN_CALLS or g.margin > 0 or g.since_call >= g.wait - 1}
    for name, rule in rules.items():
        ratios, calls, n = [], 0, 0
        for rounds in prompts.values():
            a, t, c = replay(rounds, rule)
            base = sum(r["a_small"] for r in rounds) / sum(r["ms_small"] for r in rounds)
            ratios.append(a / t / base)
            calls, n = calls + c, n + len(rounds)
        print(f"{name:22s} {np.mean(ratios):.4f}x all-small's speed (mean per prompt), calls in {calls / n:.0%} of rounds")


if __name__ == "__main__":
    main(sys.argv[1:])
