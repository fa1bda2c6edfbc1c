"""Replay step-1 rules on measured trial rounds (`scripts/call_trials.py` output): each round's outcome with or without
the call, as the rule decides from the rounds before it (the gate sees only its own estimates of its call rounds).
Prints the mean per-prompt speed against all-small's and the share of rounds called, then what no step-1 rule can beat
on these rounds (hindsight: calling exactly where the call paid, per round or per prompt), what a rule reading one
signal before the call would keep (`SIGNALS`: the target's top-1 probability at the root, the previous round's path,
the n-gram drafter's match at the root; thresholds at their quartiles), and what calling always would give if a call
round cost `--cheaper` ms less (the head and its glue made cheaper, the same tokens). `--by-category`: the same bounds
within each category too (where a category's target lies beyond calling always and the per-prompt hindsight, only a
rule that finds the rounds where a call pays, or a cheaper call, reaches it). `--learned`: a rule that reads every
signal at once, a ridge regression of a call's net gain on them, fitted on the other prompts and replayed on each one
(leave one prompt out), so it shows whether the signals together find the paying rounds that none finds alone.

    PYTHONPATH=. .venv/bin/python scripts/gate_replay.py artifacts/call_trials-bench.json artifacts/call_trials-unseen.json
"""
import argparse
import json
from collections import defaultdict

import numpy as np

from treegraft.scheduler import online
from treegraft.scheduler.online import Yield, YieldGate


# what a rule could read before a round's call (scripts/call_trials.py): the target's top-1 probability at the root,
# the previous round's accepted path and its n-gram nodes, the n-gram drafter's match order, top p and copied span
# at the root
SIGNALS = ("p1", "prev_a", "prev_small", "ng_order", "ng_p", "ng_span")


def replay(rounds: list[dict], rule) -> tuple[float, float, int]:
    gate, tokens, ms, calls = YieldGate(), 0.0, 0.0, 0
    for r in rounds:
        called = rule(gate)
        key = "call" if called else "small"
        tokens, ms, calls = tokens + r["a_" + key], ms + r["ms_" + key], calls + called
        gate.observe(called, Yield(r["y_a"], r["y_ms"], r["y_a0"], r["y_ms0"]) if called else None)
    return tokens, ms, calls


def speed(rounds: list[dict], called) -> float:
    """Tokens per ms with the call in the rounds where `called` [n] is True, against all-small's."""
    a = sum(r["a_call" if c else "a_small"] for r, c in zip(rounds, called))
    t = sum(r["ms_call" if c else "ms_small"] for r, c in zip(rounds, called))
    return a / t / (sum(r["a_small"] for r in rounds) / sum(r["ms_small"] for r in rounds))


def net_gain(rounds: list[dict]):
    """A round -> a call's net gain there in tokens, (a - a') - rho (t - t'), its extra time priced at all-small's
    rate rho over `rounds` (what the gate's margin sums, scheduler/online.py)."""
    rho = sum(r["a_small"] for r in rounds) / sum(r["ms_small"] for r in rounds)
    return lambda r: r["a_call"] - r["a_small"] - rho * (r["ms_call"] - r["ms_small"])


def bounds(prompts: dict, cheaper: list[float]) -> dict[str, tuple[float, float]]:
    """{rule: (mean per-prompt speed against all-small's, share of rounds called)}: hindsight rules (no step-1 rule
    beats them on these rounds), thresholds on each of the `SIGNALS` the rows carry, and
    calling always with each call round `cheaper` ms shorter."""
    rounds = [r for rs in prompts.values() for r in rs]
    gain = net_gain(rounds)
    per_prompt = {k: speed(rs, [True] * len(rs)) > 1 for k, rs in prompts.items()}
    always = lambda k, rs: [True] * len(rs)  # noqa: E731
    rules = {"hindsight, per round": (lambda k, rs: [gain(r) > 0 for r in rs], 0.0),  # name -> (rule, ms cheaper)
             "hindsight, per prompt": (lambda k, rs: [per_prompt[k]] * len(rs), 0.0)}
    for sig in SIGNALS:  # thresholds at the signal's quartiles (a round without it, the first, calls)
        if not all(sig in r for r in rounds):
            continue
        for q in (0.25, 0.5, 0.75):
            cut = float(np.quantile([r[sig] for r in rounds if r[sig] is not None], q))
            rules[f"call where {sig} >= {cut:.2f}"] = (
                lambda k, rs, c=cut, g=sig: [r[g] is None or r[g] >= c for r in rs], 0.0)
            rules[f"call where {sig} < {cut:.2f}"] = (
                lambda k, rs, c=cut, g=sig: [r[g] is None or r[g] < c for r in rs], 0.0)
    for c in cheaper:
        rules[f"always, a call {c:g} ms cheaper"] = (always, c)
    out = {}
    for name, (rule, c) in rules.items():
        shorter = {k: [dict(r, ms_call=r["ms_call"] - c) for r in rs] for k, rs in prompts.items()}
        called = {k: rule(k, rs) for k, rs in shorter.items()}
        out[name] = (float(np.mean([speed(rs, called[k]) for k, rs in shorter.items()])),
                     float(np.mean([x for cs in called.values() for x in cs])))
    return out


def signal_row(r: dict) -> list[float]:
    """A round's signals as numbers: each of `SIGNALS` it carries (a missing previous round: 0 and a flag), the
    copied span on a log scale; the target's entropy at the root where the row has it."""
    out = []
    for sig in SIGNALS + ("ent",):
        if sig not in r:
            continue
        x = r[sig]
        out += [0.0 if x is None else float(np.log1p(x) if sig == "ng_span" else x)] + (
            [float(x is None)] if sig.startswith("prev") else [])
    return out


def learned(prompts: dict, ridge: float = 10.0) -> tuple[float, float]:
    """(mean per-prompt speed against all-small's, share of rounds called) of "call where the predicted net gain
    (tokens) is positive", the prediction a ridge regression on `signal_row` fitted on every other prompt's
    rounds."""
    keys = list(prompts)
    rows = {k: np.array([signal_row(r) for r in prompts[k]]) for k in keys}
    gain = net_gain([r for rs in prompts.values() for r in rs])
    gains = {k: np.array([gain(r) for r in prompts[k]]) for k in keys}
    speeds, called = [], []
    for k in keys:
        x = np.concatenate([rows[j] for j in keys if j != k])
        y = np.concatenate([gains[j] for j in keys if j != k])
        mu, sd = x.mean(0), x.std(0) + 1e-9
        z = np.c_[(x - mu) / sd, np.ones(len(x))]
        w = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ y)
        calls = (np.c_[(rows[k] - mu) / sd, np.ones(len(rows[k]))] @ w > 0).tolist()
        speeds.append(speed(prompts[k], calls))
        called += calls
    return float(np.mean(speeds)), float(np.mean(called))


def by_category(prompts: dict, cheaper: list[float]) -> dict[str, tuple[int, dict[str, tuple[float, float]]]]:
    """{category: (prompts, `bounds` over that category's prompts alone)}, categories in name order; calling always
    is among them (no cost saved), as the best rule that reads nothing."""
    cats = defaultdict(dict)
    for key, rounds in prompts.items():
        cats[rounds[0].get("cat", "all")][key] = rounds
    out = {}
    for cat in sorted(cats):
        rows = bounds(cats[cat], cheaper)
        rows["always"] = (float(np.mean([speed(rs, [True] * len(rs)) for rs in cats[cat].values()])), 1.0)
        out[cat] = (len(cats[cat]), rows)
    return out


def line(name: str, ratio: float, share: float) -> None:
    print(f"{name:22s} {ratio:.4f}x all-small's speed (mean per prompt), calls in {share:.0%} of rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="scripts/call_trials.py outputs")
    ap.add_argument("--cheaper", default="1,2,3", help="ms a call round might save (comma-separated)")
    ap.add_argument("--by-category", action="store_true", help="the bounds within each category as well")
    ap.add_argument("--learned", action="store_true", help="a rule reading every signal at once, held out by prompt")
    args = ap.parse_args()
    cheaper = [float(c) for c in args.cheaper.split(",") if c]
    prompts = defaultdict(list)
    for f in args.files:
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
        line(name, float(np.mean(ratios)), calls / n)
    for name, (ratio, share) in bounds(prompts, cheaper).items():
        line(name, ratio, share)
    if args.learned:
        line("learned, held out", *learned(prompts))
    if args.by_category:
        for cat, (n, out) in by_category(prompts, cheaper).items():
            print(f"{cat} ({n} prompts): " + "; ".join(f"{name} {ratio:.3f}x" for name, (ratio, _) in out.items()
                                                        if not name.startswith("call where")))
    rounds = [r for rs in prompts.values() for r in rs]
    if all("p1" in r for r in rounds):
        gain = net_gain(rounds)
        corr = np.corrcoef([r["p1"] for r in rounds], [gain(r) for r in rounds])[0, 1]
        print(f"the target's p1 at the root against a call's net gain (tokens): r = {corr:+.3f}")


if __name__ == "__main__":
    main()
