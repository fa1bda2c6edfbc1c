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

Copied spans (prompt lookup's reach within SPEC 2.4). Where the context holds a
long match, the text that followed it is likely copied again (summaries, quotes,
code edits). So the best child of a frontier node is extended, within the same
small step, into a chain: the index is asked again after each chain token, and the
chain grows while (1) the longest matching suffix is at least SPAN_MIN_MATCH tokens
long, (2) the top follower is unambiguous enough, p = count / total >= SPAN_MIN_P,
and (3) at most `span_max` tokens. Its length thus follows the match length and the
followers' frequency, as SuffixDecoding's does; each chain node carries the index's
own p, so scores, the prune to B_ver and the cost-aware cut treat it like any other
node. It is still SPEC 2.4's rule (longest suffix, followers by count) applied to
the chain's own path, so the step stays one small step of the D, over the same pool
and frontier; only its depth grows. Cost: one look-up of <= n_max dict reads per
chain token.

The target's earlier answers (SuffixDecoding's global store, `corpus.py`). Given a
`CorpusIndex`, a look-up asks both the context and the corpus; the source whose
matching suffix is longer leads (the context on a tie: the request's own text is
the better evidence), and the other fills the remaining of the K places with its p
scaled by BACKOFF. A span continues on either source's long match. Measured offline
on the bench's greedy answers (teacher-forced, chains of 5): this rule beat context
only, corpus only, the corpus only as a fill-in, and the corpus leading on ties
(docs/tuning.md).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

from ..profile import profiled
from ..prune import expandable
from ..trace import StepTrace
from ..tree import SMALL, DraftTree, add_child, path_tokens, recompute_scores, small_pool, small_sites, top_w

if TYPE_CHECKING:
    from .corpus import CorpusIndex

BACKOFF = 0.25
SPAN_MIN_MATCH = 3  # a chain token needs a matching suffix of at least this many tokens
SPAN_MIN_P = 0.5  # ... and a top follower with at least this share of the continuations


class NgramIndex:
    def __init__(self, n_max: int = 5, corpus: CorpusIndex | None = None):
        self.n_max = n_max
        self.corpus = corpus  # read-only, shared by every session
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
        return self._propose(tail, k)[0]

    @profiled("ngram")
    def span(self, tail: list[int], max_len: int) -> list[tuple[int, float]]:
        """A copied chain after `context + tail`: (token, p) while the match is long and its follower clear."""
        chain: list[tuple[int, float]] = []
        tail = list(tail)
        while len(chain) < max_len:
            props, order = self._propose(tail, 1)
            if not props or order < SPAN_MIN_MATCH or props[0][1] < SPAN_MIN_P:
                break
            chain.append(props[0])
            tail = (tail + [props[0][0]])[-self.n_max:]
        return chain

    def _propose(self, tail: list[int], k: int) -> tuple[list[tuple[int, float]], int]:
        """(up to k (token, p) best first, the order n of the longest matching suffix; 0: no match): the
        context's, merged with the corpus's where there is one (module docstring)."""
        own, order = self._context(tail, k)
        if self.corpus is None:
            return own, order
        m = self.corpus.n_max
        if order >= m and len(own) >= k:  # the corpus could neither lead (its matches are <= m) nor fill in
            return own, order
        seq = tuple(tail[-m:]) if len(tail) >= m else tuple(self.tokens[len(tail) - m:] + tail)
        other, corpus_order = self.corpus.propose(seq, k)
        if corpus_order > order:
            own, other, order = list(other), own, corpus_order
        if len(own) < k and other:
            seen = {t for t, _ in own}
            own = own + [(t, BACKOFF * p) for t, p in other if t not in seen][: k - len(own)]
        return own, order

    def _context(self, tail: list[int], k: int) -> tuple[list[tuple[int, float]], int]:
        """`_propose` over the context alone."""
        seq = self.tokens[-self.n_max:] + tail if len(tail) < self.n_max else tail
        out: list[tuple[int, float]] = []
        longest = 0
        seen: set[int] = set()
        scale = 1.0
        for n in range(min(self.n_max, len(seq)), 0, -1):
            followers = self.tables[n].get(tuple(seq[-n:]))
            if not followers:
                continue
            longest = longest or n
            total = sum(c for c, _ in followers.values())
            ranked = sorted(followers.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
            for tok, (count, _) in ranked:
                if tok not in seen:
                    out.append((tok, scale * count / total))
                    seen.add(tok)
                    if len(out) == k:
                        return out, longest
            scale *= BACKOFF
        return out, longest


class SmallDrafter:
    """A small step (SPEC 2.1, 2.4): pool = N_k (and the mid's graft sites it has not expanded where
    `small_pool` is "shared", tree.small_sites), frontier = its top-W by s(v), each frontier node gets the
    n-gram index's top-K followers of context + its path, grafted non-destructively; the best of them is
    extended into a copied span where the context holds a long match (`span_max` > 0)."""

    action = SMALL

    @profiled("tree")
    def step(self, s, tree: DraftTree, k: int) -> StepTrace:
        d = s.drafting
        pool = expandable(tree, small_sites(tree) if d.small_pool == "shared" else small_pool(tree))
        frontier = top_w(tree, pool, d.width)
        tree.small_expanded[frontier] = True
        added, confirmed = [], []
        for f in frontier.tolist():
            tail = path_tokens(tree, f, d.ngram_max)
            for i, (tok, p) in enumerate(s.ngram.propose(tail, d.top_k)):
                v, new = add_child(tree, f, tok, math.log(p), SMALL, k)
                (added if new else confirmed).append(v)
                if i == 0 and new and d.span_max:  # an existing child already carries its span
                    for tok2, p2 in s.ngram.span((tail + [tok])[-d.ngram_max:], d.span_max):
                        v, new = add_child(tree, v, tok2, math.log(p2), SMALL, k)
                        (added if new else confirmed).append(v)
        if confirmed:
            recompute_scores(tree)
        tree.last_added = added + confirmed
        return StepTrace(k, "small", pool=pool.tolist(), frontier=frontier.tolist(), added=added,
                         confirmed=confirmed, n_k=len(pool))


