"""Is the cost-aware cut's pi(v) calibrated? Runs a method on training-suite prompts (each generation from the
calibrated state, as the bench does; --keep: the record carries over between prompts and only the second half is
read) and prints the mean pi of the verified nodes against the share accepted, by rank in the cut's order, by pi
and by depth.

    PYTHONPATH=. .venv/bin/python scripts/cut_calibration.py --method all-small --per-category 2
"""
import argparse

import numpy as np

from treegraft.bench import parse_methods
from treegraft.config import GenerationConfig, load_pair
from treegraft.engine import Engine
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts, select
from treegraft.prune import Pruner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="default")
    ap.add_argument("--method", default="all-small")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    pair = load_pair(args.pair)
    engine = Engine(load_pair_models(pair, args.dtype))
    method = parse_methods(args.method, pair.drafting)[-1]
    records: list[list[tuple]] = []  # per prompt: (pi, rank, depth, accepted)
    select_, learn_ = Pruner.select, Pruner.learn
    last = {}

    def recording_select(self, tree, *a, **k):
        chosen = select_(self, tree, *a, **k)
        last["cut"] = (tree, chosen, self.acceptance.path_acceptance(tree, chosen)) if len(chosen) else None
        return chosen

    def recording_learn(self, tree, kept, path, *a, **k):
        if last.get("cut") is not None:
            t, chosen, pi = last["cut"]
            on_path = set(path)
            for rank, i in enumerate(np.argsort(-pi, kind="stable")):
                records[-1].append((pi[i], rank, t.depth[chosen[i]], int(chosen[i]) in on_path))
        return learn_(self, tree, kept, path, *a, **k)

    Pruner.select, Pruner.learn = recording_select, recording_learn
    prompts = select(load_prompts("train"), per_category=args.per_category)
    gen = GenerationConfig(max_new_tokens=64)
    records.append([])  # the warm-up's rounds, not read
    engine.generate(engine.encode(prompts[0].messages), method.spec, method.drafting,
                    gen.model_copy(update={"max_new_tokens": 8}))  # warm-up and calibration, as the bench
    state = engine.state()
    for p in prompts:
        if not args.keep:
            engine.restore(state)
        records.append([])
        engine.generate(engine.encode(p.messages), method.spec, method.drafting, gen)
    records = records[1:]
    rows = [r for per in records[len(records) // 2 if args.keep else 0:] for r in per]
    a = np.array(rows, dtype=float)
    print(f"{len(a)} verified nodes; host {engine.host_costs(method.drafting)}")
    print("mean pi / share accepted")
    tables = (("rank", 1, [0, 1, 2, 3, 5, 7, 11, 15, 64]), ("pi", 0, [0, .02, .05, .1, .2, .4, .7, 1.01]),
              ("depth", 2, list(range(1, 9))))
    for name, col, edges in tables:
        print(f"by {name}:")
        for lo, hi in zip(edges, edges[1:]):
            s = a[(a[:, col] >= lo) & (a[:, col] < hi)]
            if len(s):
                print(f"  {lo:g}-{hi:g}: {len(s):5d} nodes, pi {s[:, 0].mean():.3f}, accepted {s[:, 3].mean():.3f}")


if __name__ == "__main__":
    main()
