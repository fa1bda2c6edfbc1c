"""How well the n-gram drafter's sources predict the target's greedy tokens, offline (no clock).

The target answers every prompt of the bench suites greedily (batched `generate`, float32); then, at each
position of each answer (teacher-forced: the context is the prompt and the answer so far), each rule proposes
K followers and a greedy chain of D tokens. Printed per category: top-1 hit rate / top-K hit rate / mean
tokens of the chain that match. Rules: the context alone (the paper's drafter), the corpus alone, the corpus
only filling in, the longer match leading (context on ties: the shipped rule), the corpus leading on ties.
Usage (docs/tuning.md):

    .venv/bin/python scripts/corpus_rules.py --tokens 64 [--corpus FILE]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from treegraft.answers import AnswerSettings, generate_batch
from treegraft.config import load_pair, resolve_path
from treegraft.drafters.corpus import load_corpus
from treegraft.drafters.ngram import BACKOFF, NgramIndex
from treegraft.models import load_pair_models
from treegraft.prompts import chat_ids, load_prompts

RULES = ["context", "corpus", "corpus fills in", "longer leads (shipped)", "corpus leads on ties"]


def merge(first, second, k):
    seen, out = set(), []
    for t, p in list(first) + [(t, BACKOFF * p) for t, p in second]:
        if t not in seen:
            seen.add(t)
            out.append((t, p))
    return out[:k]


def propose(rule, ctx: NgramIndex, corpus, tail, k):
    """The shipped rule and the context alone are the drafter's own code; the alternatives are built here."""
    if rule == "longer leads (shipped)":
        return ctx._propose(tail, k)[0]
    own, oc = ctx._context(tail, k)
    if rule == "context":
        return own
    seq = tuple((ctx.tokens[-corpus.n_max:] + tail)[-corpus.n_max:])
    other, og = corpus.propose(seq, k)
    return {"corpus": lambda: list(other), "corpus fills in": lambda: merge(own, other, k),
            "corpus leads on ties": lambda: merge(other, own, k) if og >= oc else merge(own, other, k)}[rule]()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="default")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--corpus", default=None, help="a corpus file to measure (default: the pair's)")
    args = ap.parse_args()
    pair = load_pair(args.pair)
    loaded = load_pair_models(pair.model_copy(update={"corpus": []}), "float32")
    files = resolve_path(args.corpus) if args.corpus else [resolve_path(f) for f in pair.corpus]
    tok, corpus = loaded.tokenizer, load_corpus(files, len(loaded.tokenizer), 5)
    prompts = load_prompts("bench") + load_prompts("default")
    settings = AnswerSettings(max_new_tokens=args.tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = []
    for i in range(0, len(prompts), 10):
        batch = prompts[i:i + 10]
        ids = [chat_ids(tok, p.messages) for p in batch]
        for p, enc, row in zip(batch, ids, generate_batch(loaded.target, ids, settings, False, pad,
                                                          tok.eos_token_id, 0)):
            rows.append((p.category, row[:len(enc)], row[len(enc):]))
    stats = {r: defaultdict(lambda: [0, 0, 0, 0]) for r in RULES}  # category -> [top-1, top-K, chain, n]
    for rule in RULES:
        for category, prompt, answer in rows:
            ctx, st = NgramIndex(pair.drafting.ngram_max, corpus), stats[rule][category]
            ctx.extend(prompt)
            for t, token in enumerate(answer):
                toks = [a for a, _ in propose(rule, ctx, corpus, [], args.k)]
                st[0] += bool(toks) and toks[0] == token
                st[1] += token in toks
                tail = []
                for d in range(min(args.depth, len(answer) - t)):
                    best = propose(rule, ctx, corpus, tail, 1)
                    if not best or best[0][0] != answer[t + d]:
                        break
                    tail.append(best[0][0])
                st[2] += len(tail)
                st[3] += 1
                ctx.extend([token])
    cats = sorted({c for c, _, _ in rows})
    print(f"{len(rows)} prompts x <= {args.tokens} tokens; corpus {corpus.describe()}")
    print("| rule | " + " | ".join(cats) + " | all |\n|---|" + "---|" * (len(cats) + 1))
    for rule in RULES:
        cells, tot = [], [0, 0, 0, 0]
        for c in cats:
            s = stats[rule][c]
            tot = [a + b for a, b in zip(tot, s)]
            cells.append(f"{s[0] / s[3]:.2f} / {s[1] / s[3]:.2f} / {s[2] / s[3]:.2f}")
        cells.append(f"{tot[0] / tot[3]:.3f} / {tot[1] / tot[3]:.3f} / {tot[2] / tot[3]:.3f}")
        print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
