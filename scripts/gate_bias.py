"""Is the yield gate's counterfactual right in a live generation? Per category of a prompt suite, each prompt generated
by all-small and by treegraft (the same greedy tokens, so the same text): all-small's own rounds (tokens per ms of
drafting + verification, its depth gate on) against treegraft's call rounds and, for those rounds, the gate's own
estimate of what they would have committed and cost without the call (`scheduler/online.round_yield`: a' / t').
Where the estimate reads below all-small's real rate the gate keeps calling where the call loses; above it, it closes
where the call pays. Where the gate calls in only some rounds, those rounds are not all-small's average ones (the
estimate then also reads which positions the gate called at): `--always` holds the gate open, so that the estimate
covers every round. `scripts/call_trials.py` checks the same estimate against trial rounds from the same states, which
take all D steps; this checks it against the rounds all-small really drafts. Run alone on the host (it times rounds).

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/gate_bias.py artifacts/gate_bias.json [--per-category 4]
"""
import argparse
import json
from collections import defaultdict

from treegraft.bench import parse_methods
from treegraft.config import DEFAULT_MODELS_YAML, GenerationConfig, load_pair
from treegraft.engine import Engine
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts, select
from treegraft.scheduler import online


def rate(tokens: float, ms: float) -> float:
    """Tokens per second."""
    return 1000 * tokens / ms if ms else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON rows: per prompt and method, its rounds (tokens, ms, called) and the gate's yields")
    ap.add_argument("--suite", default="bench")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--always", action="store_true", help="the gate held open (every round a call round), so that the "
                    "estimate is read at every position all-small drafts, not only where the gate chose to call")
    args = ap.parse_args()
    if args.always:
        online.YieldGate.wants_call = lambda gate: True
    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine = Engine(load_pair_models(pair, "float32"))
    methods = {m.spec.name: m for m in parse_methods("all-small,treegraft", pair.drafting)}
    yields = []
    estimate = online.round_yield

    def recorded(outcome):
        y = estimate(outcome)
        yields.append((y.tokens, y.ms, y.tokens_without, y.ms_without))
        return y

    online.round_yield = recorded  # what GatedPolicy.observe computes, kept as it is computed
    rows, fresh = [], engine.state()
    for p in select(load_prompts(args.suite), per_category=args.per_category):
        ids = engine.encode(p.messages)
        for name, m in methods.items():
            engine.restore(fresh)  # each method learns from its own rounds only
            yields.clear()
            res = engine.generate(ids, m.spec, m.drafting, GenerationConfig(max_new_tokens=64))
            rounds = [(r.accepted + 1, 1000 * (r.draft_s + r.verify_s), bool(r.steps) and r.steps[0].action == "mid")
                      for r in res.rounds]
            rows.append(dict(prompt=p.id, cat=p.category, method=name, rounds=rounds, yields=list(yields)))
    json.dump(rows, open(args.out, "w"))
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["cat"]][r["method"]].append(r)
    print("category       all-small  treegraft call rounds (share)  the gate's estimate: with / without the call")
    for cat in sorted(by):
        small = [x for r in by[cat]["all-small"] for x in r["rounds"]]
        calls = [x for r in by[cat]["treegraft"] for x in r["rounds"] if x[2]]
        every = [x for r in by[cat]["treegraft"] for x in r["rounds"]]
        ys = [y for r in by[cat]["treegraft"] for y in r["yields"]]
        est = (f"{rate(sum(y[0] for y in ys), sum(y[1] for y in ys)):5.1f} / "
               f"{rate(sum(y[2] for y in ys), sum(y[3] for y in ys)):5.1f}") if ys else "-"
        print(f"{cat:13s} {rate(sum(x[0] for x in small), sum(x[1] for x in small)):6.1f}/s "
              f"{rate(sum(x[0] for x in calls), sum(x[1] for x in calls)):10.1f}/s ({len(calls) / len(every):4.0%})"
              f"          {est}")


if __name__ == "__main__":
    main()
