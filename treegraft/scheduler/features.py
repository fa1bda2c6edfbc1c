"""Scheduler inputs z_k, computed before each draft step in O(tree) (SPEC 5).

`TREE_CANDIDATES` are the candidate tree signals (the paper starts from 10 and keeps
six by grouped cross-validation; `python -m treegraft scheduler train` prints the
selection). `CONTEXT` are the context and history inputs, always used. With the
paper's six tree signals and D = 5 the input has 6 + 6 + 5 = 17 entries.
"""
from __future__ import annotations

import math

import numpy as np

from ..methods import StepState
from ..tree import MID, SMALL, mid_pool, small_pool, top_w

TREE_CANDIDATES = (
    "frontier_depth",  # depth of the current frontier N_k / D
    "leaf_ratio",  # leaves / live nodes
    "collapse_debt",  # log s_best at the last mid step (or the root) - log s_best now
    "past_reselect_ratio",  # share of the would-be mid frontier shallower than the current frontier
    "reselect_overlap",  # |small frontier & would-be mid frontier| / W
    "reselect_score",  # mean log s of the would-be mid frontier
    "tree_fill",  # live nodes / (D * W * K)
    "pool_ratio",  # log(|mid pool| / max(1, |N_k|))
    "best_score",  # log s_best over N_k (0 when N_k is empty)
    "small_empty",  # 1 when the small drafter has nothing to expand (N_k empty)
    "small_share",  # share of live nodes created by the small drafter
    "last_logp",  # mean log p of the nodes the previous step produced
)
PAPER_SIX = TREE_CANDIDATES[:6]


TIMING = ("t_target_ms", "t_mid_ms", "log_t_ratio", "verify_growth")  # what a host's costs change (costs.py)


def context_names(depth: int) -> list[str]:
    """Every context input a collected row records; a scheduler file lists the ones it uses (older files
    were trained without `verify_growth`)."""
    return (["log_prompt_len", "t_target_ms", "t_mid_ms", "log_t_ratio", "k_over_D", "mid_calls_over_D"]
            + [f"called_mid_{j}" for j in range(1, depth + 1)] + ["verify_growth"])


def tree_features(st: StepState, width: int, top_k: int, last_mid_best: float) -> dict[str, float]:
    tree = st.tree
    n = tree.n
    alive = tree.alive[:n]
    live = int(alive.sum())
    has_child = np.zeros(n, dtype=bool)
    parents = tree.parent[:n][alive]
    has_child[parents[parents >= 0]] = True
    leaves = int((alive & ~has_child).sum())
    nk = small_pool(tree)
    small_f = top_w(tree, nk, width)
    pool = mid_pool(tree)
    mid_f = top_w(tree, pool, width)
    cur_depth = int(tree.depth[nk].max()) if len(nk) else tree.max_leaf_depth()
    best = float(tree.score[nk].max()) if len(nk) else 0.0
    return {
        "frontier_depth": cur_depth / st.depth,
        "leaf_ratio": leaves / live,
        "collapse_debt": last_mid_best - best if len(nk) else 0.0,
        "past_reselect_ratio": float(np.mean(tree.depth[mid_f] < cur_depth)) if len(mid_f) else 0.0,
        "reselect_overlap": len(set(small_f.tolist()) & set(mid_f.tolist())) / width,
        "reselect_score": float(tree.score[mid_f].mean()) if len(mid_f) else 0.0,
        "tree_fill": live / (st.depth * width * top_k),
        "pool_ratio": math.log(max(1, len(pool)) / max(1, len(nk))),
        "best_score": best,
        "small_empty": float(len(nk) == 0),
        "small_share": float((tree.drafter[:n][alive] == SMALL).sum()) / live,
        "last_logp": float(tree.logp[nk].mean()) if len(nk) else 0.0,
    }


def context_features(st: StepState) -> list[float]:
    """Values in `context_names` order. verify_growth = log T(8) / T(0): how fast verification cost grows with
    the tree on this host and dtype (measured at load by the pruner's calibration; 0 when not measured)."""
    t_t, t_m = max(st.t_target_ms, 1e-3), max(st.t_mid_ms, 1e-3)
    bits = [float(a == MID) for a in st.actions] + [0.0] * (st.depth - len(st.actions))
    return [math.log1p(st.prompt_len), st.t_target_ms, st.t_mid_ms, math.log(t_t / t_m), st.k / st.depth,
            sum(bits) / st.depth] + bits + [st.verify_growth]


class FeatureTracker:
    """Per-round memory the features need (the best score at the last mid step)."""

    def __init__(self, width: int, top_k: int):
        self.width, self.top_k = width, top_k
        self.last_mid_best = 0.0

    def start_round(self) -> None:
        self.last_mid_best = 0.0

    def all_features(self, st: StepState) -> tuple[dict[str, float], list[float]]:
        if st.actions and st.actions[-1] == MID:
            nk = small_pool(st.tree)  # after a mid step N_k is what it produced
            self.last_mid_best = float(st.tree.score[nk].max()) if len(nk) else self.last_mid_best
        return tree_features(st, self.width, self.top_k, self.last_mid_best), context_features(st)

    def vector(self, st: StepState, tree_names: list[str], ctx_names: list[str] | None = None) -> np.ndarray:
        tree, ctx = self.all_features(st)
        if ctx_names is not None:
            named = dict(zip(context_names(st.depth), ctx))
            ctx = [named[n] for n in ctx_names]
        return np.array([tree[n] for n in tree_names] + ctx, dtype=np.float32)
