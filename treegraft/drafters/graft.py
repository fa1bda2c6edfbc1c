"""A mid step (SPEC 2.1, 2.2): where the mid grafts (EG) and how (ND), in one place.

Where (expanded graft sites): the pool C_k is every live node the mid has not
evaluated, root included (w/o EG: N_k, as a small step). The mid scores the pool and
its unvisited ancestors in one call (`mid_levels` bounds the pool, so one call's work
stays bounded) (`MidDrafter` or `HeadDrafter`, the same
interface); every child of an evaluated node gets p = q_mid(token | parent) and
scores are recomputed top-down; the frontier F_k is the pool's top-W by the
refreshed s(v) (graft sites).

How (non-destructive grafting): each graft site gets the mid's top-K tokens as new
children beside the ones it has; a token already there keeps its node, p refreshed
and confirmed by the mid (`add_child`). w/o ND: the site's subtree is deleted first
(an overwrite, as sequence-level cascades do).
"""
from __future__ import annotations

import numpy as np
import torch

from ..profile import profiled
from ..prune import expandable
from ..trace import StepTrace
from ..tree import (MID, DraftTree, add_child, delete_subtree, mid_pool, recompute_scores, reselection_rate,
                    node_levels, rows_of, set_drafter_logp, small_pool, top_w, unvisited_closure)
from .neural import MidScores


def refresh_children(tree: DraftTree, batch: np.ndarray, logq: MidScores) -> None:
    """The mid's q(token(c) | parent(c)) for every live child of an evaluated node; then s top-down. Paper
    rule: p(c) = q. Calibrated: q is added to c's evidence (tree.py), so a confident n-gram branch keeps
    what its acceptance record earns. Tokens outside the mid's draft vocabulary keep their p (the mid has no
    opinion on them)."""
    row = rows_of(batch, tree.n)
    n = tree.n
    kids = np.flatnonzero(tree.alive[:n] & (tree.parent[:n] >= 0))
    kids = kids[row[tree.parent[kids]] >= 0]
    if len(kids):
        lp, known = logq.of(torch.from_numpy(row[tree.parent[kids]]), torch.from_numpy(tree.token[kids]))
        known = known.cpu().numpy()
        set_drafter_logp(tree, kids[known], MID, lp.double().cpu().numpy()[known])
        recompute_scores(tree)


class MidGrafter:
    """The mid step of the shared tree, over a mid drafter (LM or draft head)."""

    action = MID

    def __init__(self, mid, eg: bool = True, nd: bool = True):
        self.mid, self.eg, self.nd = mid, eg, nd

    @profiled("mid_prefill")
    def feed_prompt(self, s) -> None:
        """The mid's prefill at its first call (`Session.prompt_at_first_call`): the committed tokens but the last in
        one plain pass, timed as prefill work (`mid_prefill`), not as a step's; the call then feeds only the tree,
        as after a prefill at the start."""
        self.mid.prefill(s.committed)

    def step(self, s, tree: DraftTree, k: int) -> StepTrace:
        leaf_depth, n_k, pool, batch = self._pool(tree, s.drafting.mid_levels)
        added, confirmed, removed, frontier = [], [], [], pool[:0]
        if len(batch):
            logq = self.mid.evaluate(tree, s.committed, batch)  # [len(batch), S]
            frontier, added, confirmed, removed = self._graft(tree, k, pool, batch, logq, s.drafting)
        return StepTrace(k, "mid", pool=pool.tolist(), frontier=frontier.tolist(), added=added, confirmed=confirmed,
                         removed=removed, n_k=n_k, reselect_rate=reselection_rate(tree, frontier, leaf_depth))

    @profiled("tree")
    def _pool(self, tree: DraftTree, levels: int | None):
        """(deepest leaf, |N_k|, the pool C_k, the batch = pool + unvisited ancestors). Two bounds on the work of
        one call: only pool nodes the prune could still keep (`tree.keep_budget`, prune.expandable), and only those
        with fewer unevaluated ancestors than `levels` (a draft head runs one forward per level); deeper ones
        wait for a later mid step."""
        pool = expandable(tree, mid_pool(tree) if self.eg else small_pool(tree))
        if levels is not None and self.eg:
            visited = set(np.flatnonzero(tree.mid_visited[: tree.n]).tolist())
            pool = pool[node_levels(tree, pool, visited) < levels]
        return tree.max_leaf_depth(), len(small_pool(tree)), pool, unvisited_closure(tree, pool)

    @profiled("tree")
    def _graft(self, tree: DraftTree, k: int, pool: np.ndarray, batch: np.ndarray, logq: MidScores, d):
        """Re-score the evaluated nodes' children, pick the top-W graft sites, add the mid's top-K under each."""
        tree.mid_visited[batch] = True
        refresh_children(tree, batch, logq)
        frontier = top_w(tree, pool, d.width)
        tree.graft_site[frontier] = True
        top_tokens, top_lp = logq.topk(torch.from_numpy(rows_of(batch, tree.n)[frontier]),
                                       d.mid_top_k or d.top_k)  # [W, K]
        added, confirmed, removed = [], [], []
        for f, toks, lps in zip(frontier.tolist(), top_tokens.tolist(), top_lp.tolist()):
            if not tree.alive[f]:  # w/o ND: an earlier graft site's overwrite deleted it
                continue
            if not self.nd:
                removed += delete_subtree(tree, f)
            for tok, lp in zip(toks, lps):
                v, new = add_child(tree, f, tok, lp, MID, k)
                (added if new else confirmed).append(v)
        if confirmed:
            recompute_scores(tree)
        tree.last_added = added + confirmed
        return frontier, added, confirmed, removed
