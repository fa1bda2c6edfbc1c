"""The sequence-level cascade contrast (CSD-style, SPEC 4): no tree, an overwrite instead of a graft.

The small drafter proposes one chain of up to D tokens (its top-1 at each step);
the mid reviews the chain in one forward and, at the first token it disagrees
with, deletes the rest of the chain and writes its own token there. Two steps
are recorded: the small chain (step 1) and the mid's review (step 2).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..kv import Stopwatch
from ..profile import profiled
from ..trace import StepTrace
from ..tree import MID, SMALL, DraftTree, add_child, delete_subtree, path_tokens
from .graft import refresh_children


class Cascade:
    note = None
    calls_mid = calls_every_round = True

    def __init__(self, mid):
        self.mid = mid

    def draft(self, s, tree: DraftTree) -> list[StepTrace]:
        watch = Stopwatch(self.mid.device)
        chain = self._chain(s, tree)
        small = StepTrace(1, "small", pool=[0], frontier=[0], added=chain[1:], n_k=1, draft_s=watch.lap())
        nodes = np.array(chain)
        logq = self.mid.evaluate(tree, s.committed, nodes)
        site, added, removed = self._review(tree, chain, logq)
        review = StepTrace(2, "mid", pool=chain, frontier=[site], added=added, removed=removed, n_k=len(chain),
                           draft_s=watch.lap())
        return [small, review]

    @profiled("tree")
    def _chain(self, s, tree: DraftTree) -> list[int]:
        v, chain = 0, [0]
        for _ in range(s.drafting.depth):
            props = s.ngram.propose(path_tokens(tree, v, s.drafting.ngram_max), 1)
            if not props:
                break
            v, _ = add_child(tree, v, props[0][0], math.log(props[0][1]), SMALL, 1)
            chain.append(v)
        return chain

    @profiled("tree")
    def _review(self, tree: DraftTree, chain: list[int], logq) -> tuple[int, list[int], list[int]]:
        """(the site the mid rewrote, its new node, the chain nodes it deleted)."""
        nodes = np.array(chain)
        tree.mid_visited[nodes] = True
        refresh_children(tree, nodes, logq)
        tokens, lps = logq.topk(torch.arange(len(chain)), 1)  # [len(chain), 1]
        for i, u in enumerate(chain):
            nxt = chain[i + 1] if i + 1 < len(chain) else None
            if nxt is not None and tree.token[nxt] == int(tokens[i, 0]):
                continue
            removed = delete_subtree(tree, u) if nxt is not None else []
            tree.graft_site[u] = True
            return u, [add_child(tree, u, int(tokens[i, 0]), float(lps[i, 0]), MID, 2)[0]], removed
        raise AssertionError("unreachable: the last chain node always gets the mid's token")
