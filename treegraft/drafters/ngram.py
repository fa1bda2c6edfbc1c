"""The small drafter: training-free n-gram retrieval over the context (SPEC 2.4).

`NgramIndex` maps every n-gram (n = 1..n_max) of the context (prompt + committed
tokens) to the tokens that followed it, with counts and the position of the last
occurrence. It is updated incrementally on commit: appending m tokens costs
O(m * n_max) dict updates, never a rescan.

Proposals for a node: the longest suffix of context + path(node) that occurs in
the context decides; its followers are ranked by count, then recency, with
p = count / total. If it has fewer than K followers, shorter suffixes fill in,
with their p scaled by BACKOFF per order dropped (a choice of ours: the summary
only says "backing off to shorter n"). A node with no match gets no children.
"""
from __future__ import annotations

import math
from collections import defaultdict

from ..profile import profiled
from ..trace import StepTrace
from ..tree import SMALL, DraftTree, add_child, path_tokens, recompute_scores, small_pool, top_w

BACKOFF = 0.25


class NgramIndex:
    def __init__(self, n_max: int = 5):
        self.n_max = n_max
        self.tokens: list[int] = []
        # tables[n][gram] -> {next_token: [count, last_position]}
        self.tables: list[dict] = [defaultdict(dict) for _ in range(n_max + 1)]

    @profiled("ngram")
    def extend(self, new_tokens: list[int]) -> None:
        toks = self.tokens
        for t in new_tokens:
            i = len(toks)
            for n in range(1, min(self.n_max, i) + 1):
                followers = self.tables[n][tuple(toks[i - n:i])]
                entry = followers.get(t)
                if entry is None:
                    followers[t] = [1, i]
                else:
                    entry[0] += 1
                    entry[1] = i
            toks.append(t)

    @profiled("ngram")
    def propose(self, tail: list[int], k: int) -> list[tuple[int, float]]:
        """Up to k (token, p) for what follows `context + tail`, best first."""
        seq = self.tokens[-self.n_max:] + tail if len(tail) < self.n_max else tail
        out: list[tuple[int, float]] = []
        seen: set[int] = set()
        scale = 1.0
        for n in range(min(self.n_max, len(seq)), 0, -1):
            followers = self.tables[n].get(tuple(seq[-n:]))
            if not followers:
                continue
            total = sum(c for c, _ in followers.values())
            ranked = sorted(followers.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
            for tok, (count, _) in ranked:
                if tok not in seen:
                    out.append((tok, scale * count / total))
                    seen.add(tok)
                    if len(out) == k:
                        return out
            scale *= BACKOFF
        return out


class SmallDrafter:
    """A small step (SPEC 2.1, 2.4): pool = N_k, frontier = its top-W by s(v), each frontier node gets the
    n-gram index's top-K followers of context + its path, grafted non-destructively."""

    action = SMALL

    @profiled("tree")
    def step(self, s, tree: DraftTree, k: int) -> StepTrace:
        d = s.drafting
        pool = small_pool(tree)
        frontier = top_w(tree, pool, d.width)
        added, confirmed = [], []
        for f in frontier.tolist():
            for tok, p in s.ngram.propose(path_tokens(tree, f, d.ngram_max), d.top_k):
                v, new = add_child(tree, f, tok, math.log(p), SMALL, k)
                (added if new else confirmed).append(v)
        if confirmed:
            recompute_scores(tree)
        tree.last_added = added + confirmed
        return StepTrace(k, "small", pool=pool.tolist(), frontier=frontier.tolist(), added=added,
                         confirmed=confirmed, n_k=len(pool))

