"""What a step-1 head call adds to a round, measured: at every round of each prompt's generation (advanced with a call
every round), interleaved trial rounds of all-small and of a call round (the pair's `mid_lead` head steps first, then
the n-gram drafter's; trial rounds take all D steps) from the same state (caches rolled back), with the yield gate's
own estimate of the call round (scheduler/online.round_yield) beside them, and what a rule could read before the
call: the target's own confidence at the row that chose the round's root (its top-1 probability `p1` and entropy
`ent`, nats), the previous round's accepted path (`prev_a`) and how many of its nodes the n-gram drafter proposed
(`prev_small`), and the n-gram drafter at the root (`ng_order`: its longest matching suffix, `ng_p`: its top
follower's p, `ng_span`: the span it would copy after it). One JSON row per round; `scripts/gate_replay.py` reads
them. Run alone on the host (it times rounds).

    PYTHONPATH=. .venv/bin/python scripts/call_trials.py bench artifacts/call_trials-bench.json
"""
import json
import sys

import numpy as np
import torch

from treegraft.config import DEFAULT_MODELS_YAML, GenerationConfig, load_pair
from treegraft.engine import Engine
from treegraft.methods import AllSmall, Fixed, MethodSpec
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts, select
from treegraft.scheduler.online import round_yield
from treegraft.tree import SMALL, proposed_by


def main(suite: str, out: str, pairs: int = 2) -> None:
    cfg = load_pair("default", DEFAULT_MODELS_YAML)
    eng, d = Engine(load_pair_models(cfg, "float32")), cfg.drafting
    prompts = select(load_prompts(suite), per_category=4)
    first = eng.encode(prompts[0].messages)
    eng.pruner.calibrate(eng.target, first, d.budget, d.verify_cost_cap, threads=[2, 1])
    eng.calibrate_mid(first, d)
    eng.calibrate_call(first, d)
    call, rows = Fixed((1,) * d.mid_lead + (0,) * (d.depth - d.mid_lead)), []  # a call round: the pair's mid_lead head steps
    head = eng.target.model.get_output_embeddings()

    @torch.no_grad()
    def confidence(features: torch.Tensor) -> dict:
        """The target's top-1 probability and entropy at one row of its features [H]."""
        logp = torch.log_softmax(head(features[None])[0], -1)
        return dict(p1=float(logp.max().exp()), ent=float(-(logp.exp() * logp).sum()))

    for p in prompts:
        state = eng.state()
        s = eng.start(eng.encode(p.messages), MethodSpec("all-mid"), d, GenerationConfig(max_new_tokens=64))
        s.plan = s.plan.with_policy(call)
        # the first root is the prompt's last token: the target's confidence in it, at the prefill's last row
        signals = dict(confidence(eng.target.features[-1]), prev_a=None, prev_small=None)
        eng.trial_round(s, call)  # warm-up
        while eng.finished(s) is None:
            props, order = s.ngram._propose([], 1)  # the n-gram drafter at the root, before any step
            top, top_p = props[0] if props else (None, 0.0)
            signals.update(ng_order=order, ng_p=top_p, ng_span=len(s.ngram.span([top], d.span_max)) if props else 0)
            ms, last = {"small": [], "call": []}, {}
            for _ in range(pairs):
                for name, policy in (("small", AllSmall()), ("call", call)):
                    last[name] = v = eng.trial_round(s, policy)
                    ms[name].append(1000 * (v.draft_s + v.verify_s))
            y = round_yield(eng.round_outcome(s, last["call"]))
            rows.append(dict(prompt=p.id, cat=p.category, a_small=len(last["small"].acc.path),
                             a_call=len(last["call"].acc.path), ms_small=float(np.median(ms["small"])),
                             ms_call=float(np.median(ms["call"])), y_a=y.tokens, y_ms=y.ms, y_a0=y.tokens_without,
                             y_ms0=y.ms_without, first=s.rounds == 0, **signals))
            v = eng.draft_and_verify(s)  # the round that moves the state on (a call at step 1), kept for its rows
            eng.learn(s, v)
            eng.commit(s, v.tree, v.acc)
            s.rounds += 1
            small = proposed_by(v.tree, np.asarray(v.acc.path[1:], dtype=np.int64), SMALL)
            signals = dict(confidence(eng.target.features[v.acc.rows[-1]]), prev_a=len(v.acc.path),
                           prev_small=int(small.sum()))
        eng.restore(state)
    json.dump(rows, open(out, "w"))
    m = {k: np.mean([r[k] for r in rows]) for k in ("a_small", "a_call", "ms_small", "ms_call", "y_a0", "y_ms0")}
    print(f"{len(rows)} rounds: all-small {m['a_small']:.2f} tokens in {m['ms_small']:.1f} ms; with the call "
          f"{m['a_call']:.2f} in {m['ms_call']:.1f} ms; the gate's estimate without it {m['y_a0']:.2f} in "
          f"{m['y_ms0']:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
