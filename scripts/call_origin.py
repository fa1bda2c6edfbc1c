"""What a head call adds to a round, by who proposed each node: treegraft on a suite's prompts (4 per category, 64 new
tokens, the engine warmed and calibrated first, every generation from the same state as the bench does), and per
category, over the rounds whose step 1 was the head's: the accepted tokens a round by proposer (the head alone, the
head and the n-gram drafter both, the n-gram drafter alone) and by the draft step that added the node, and the
verified nodes a round by proposer with the share of the head-alone ones that the target accepted (of those whose
parent it accepted) against what the cut expected of them. A node both drafters proposed the n-gram drafter would
have drafted without the call too, so what a call adds beyond all-small is mostly the head-alone column. It prints
counts, not times, but the yield gate and the cut decide from this host's timings: run it alone, as the bench.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/call_origin.py [--suite bench]
"""
import argparse
import math
from collections import defaultdict

from treegraft.bench import warm_up
from treegraft.config import DEFAULT_MODELS_YAML, GenerationConfig, load_pair
from treegraft.engine import Engine
from treegraft.methods import MethodSpec
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts, select
from treegraft.trace import RoundTrace
from treegraft.tree import MID, SMALL

WHO = {1 << SMALL: "n-gram", 1 << MID: "head", (1 << SMALL) | (1 << MID): "both"}  # TreeSnapshot.confirmed bits


def call_origin(rounds: list[RoundTrace]) -> dict[str, float]:
    """Sums over the call rounds among `rounds` (step 1 the head's): "rounds"; "accepted <who> step <k>" (accepted
    nodes); "verified <who>"; "tried head", "hit head": verified head-alone nodes whose parent was accepted, and of
    those the accepted ones."""
    out: dict[str, float] = defaultdict(float)
    for r in rounds:
        if not r.steps or r.steps[0].action != "mid":
            continue
        t, path = r.tree, r.accepted_path
        on_path = set(path)
        out["rounds"] += 1
        for v in path[1:]:
            out[f"accepted {WHO[t.confirmed[v]]} step {t.step[v]}"] += 1
        for v in range(1, len(t.kept)):
            if not t.kept[v]:
                continue
            who = WHO[t.confirmed[v]]
            out[f"verified {who}"] += 1
            if t.parent[v] in on_path:  # a trial: c(v) = pi(v) / pi(parent), the cut's estimate when it verified v
                out[f"tried {who}"] += 1
                out[f"hit {who}"] += v in on_path
                out[f"expected {who}"] += math.exp(t.score[v] - t.score[t.parent[v]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="bench")
    args = ap.parse_args()
    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine, drafting = Engine(load_pair_models(pair, "float32")), pair.drafting
    prompts, gen = select(load_prompts(args.suite), per_category=4), GenerationConfig(max_new_tokens=64)
    state = warm_up(engine, engine.encode(prompts[0].messages), drafting, gen)
    by_cat: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in prompts:
        engine.restore(state)
        res = engine.generate(engine.encode(p.messages), MethodSpec("treegraft"), drafting, gen)
        for k, v in call_origin(res.rounds).items():
            by_cat[p.category][k] += v
    print("per call round: accepted tokens by proposer (and step), verified nodes by proposer; per trial (a verified "
          "node whose parent was accepted): how often it was accepted against the c the cut read")
    for cat, c in sorted(by_cat.items()):
        n = max(c["rounds"], 1)
        acc = {who: sum(v for k, v in c.items() if k.startswith(f"accepted {who} ")) / n for who in WHO.values()}
        steps = " ".join(f"{k.removeprefix('accepted ')} {v / n:.2f}" for k, v in sorted(c.items())
                         if k.startswith("accepted "))
        print(f"{cat:14s} {int(c['rounds']):4d} call rounds | accepted: head {acc['head']:.2f}, "
              f"both {acc['both']:.2f}, n-gram {acc['n-gram']:.2f} | verified: head {c['verified head'] / n:.2f}, both "
              f"{c['verified both'] / n:.2f}, n-gram {c['verified n-gram'] / n:.2f} | hit / expected: "
              + ", ".join(f"{who} {c[f'hit {who}'] / max(c[f'tried {who}'], 1):.2f} / "
                          f"{c[f'expected {who}'] / max(c[f'tried {who}'], 1):.2f} of {int(c[f'tried {who}'])}"
                          for who in WHO.values()) + f" | {steps}")


if __name__ == "__main__":
    main()
