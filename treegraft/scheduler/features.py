"""Scheduler inputs z_k, computed before each draft step in O(tree) (SPEC 5).

`TREE_CANDIDATES` are the candidate tree signals (the paper starts from 10 and keeps
six by grouped cross-validation; `python -m treegraft scheduler train` prints the
selection). `CONTEXT` are the context and history inputs, always used. With the
paper's six tree signals and D = 5 the input has 6 + 6 + 5 = 17 entries.
"""
from __future__ import annotations

import math
from functools import cached_property

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


class _TreeSignals:
    """The tree signals of one step (one method per name of TREE_CANDIDATES), each computed on first use from
    parts computed once: the online scheduler asks only for the ones its file names (one, for the default
    pair), collection for all."""

    def __init__(self, st: StepState, width: int, top_k: int, last_mid_best: float):
        self.st, self.tree, self.width, self.top_k, self.last_mid_best = st, st.tree, width, top_k, last_mid_best
        self.n = self.tree.n

    @cached_property
    def alive(self) -> np.ndarray:
        return self.tree.alive[:self.n]

    @cached_property
    def live(self) -> int:
        return int(self.alive.sum())

    @cached_property
    def nk(self) -> np.ndarray:
        return small_pool(self.tree)

    @cached_property
    def pool(self) -> np.ndarray:
        return mid_pool(self.tree)

    @cached_property
    def mid_f(self) -> np.ndarray:
        return top_w(self.tree, self.pool, self.width)

    @cached_property
    def cur_depth(self) -> int:
        return int(self.tree.depth[self.nk].max()) if len(self.nk) else self.tree.max_leaf_depth()

    @cached_property
    def best(self) -> float:
        return float(self.tree.score[self.nk].max()) if len(self.nk) else 0.0

    def frontier_depth(self) -> float:
        return self.cur_depth / self.st.depth

    def leaf_ratio(self) -> float:
        has_child = np.zeros(self.n, dtype=bool)
        parents = self.tree.parent[:self.n][self.alive]
        has_child[parents[parents >= 0]] = True
        return int((self.alive & ~has_child).sum()) / self.live

    def collapse_debt(self) -> float:
        return self.last_mid_best - self.best if len(self.nk) else 0.0

    def past_reselect_ratio(self) -> float:
        return float(np.mean(self.tree.depth[self.mid_f] < self.cur_depth)) if len(self.mid_f) else 0.0

    def reselect_overlap(self) -> float:
        small_f = top_w(self.tree, self.nk, self.width)
        return len(set(small_f.tolist()) & set(self.mid_f.tolist())) / self.width

    def reselect_score(self) -> float:
        return float(self.tree.score[self.mid_f].mean()) if len(self.mid_f) else 0.0

    def tree_fill(self) -> float:
        return self.live / (self.st.depth * self.width * self.top_k)

    def pool_ratio(self) -> float:
        return math.log(max(1, len(self.pool)) / max(1, len(self.nk)))

    def best_score(self) -> float:
        return self.best

    def small_empty(self) -> float:
        return float(len(self.nk) == 0)

    def small_share(self) -> float:
        return float((self.tree.drafter[:self.n][self.alive] == SMALL).sum()) / self.live

    def last_logp(self) -> float:
        return float(self.tree.logp[self.nk].mean()) if len(self.nk) else 0.0

    def value(self, name: str) -> float:
        if name not in TREE_CANDIDATES:
            raise KeyError(f"unknown tree feature {name!r} (TREE_CANDIDATES)")
        return getattr(self, name)()


def tree_features(st: StepState, width: int, top_k: int, last_mid_best: float,
                  names: tuple[str, ...] | list[str] = TREE_CANDIDATES) -> dict[str, float]:
    """The named tree signals (default: every candidate) of the step about to be taken."""
    signals = _TreeSignals(st, width, top_k, last_mid_best)
    return {name: signals.value(name) for name in names}


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

    def all_features(self, st: StepState, names=TREE_CANDIDATES) -> tuple[dict[str, float], list[float]]:
        if st.actions and st.actions[-1] == MID:
            nk = small_pool(st.tree)  # after a mid step N_k is what it produced
            self.last_mid_best = float(st.tree.score[nk].max()) if len(nk) else self.last_mid_best
        return tree_features(st, self.width, self.top_k, self.last_mid_best, names), context_features(st)

    def vector(self, st: StepState, tree_names: list[str], ctx_at: list[int] | None = None) -> np.ndarray:
        """[len(tree_names) + len(ctx_at)] g_psi's input; ctx_at: the positions in `context_names` order of the
        context inputs it reads (`context_positions`; None: every one)."""
        tree, ctx = self.all_features(st, tree_names)
        if ctx_at is not None:
            ctx = [ctx[i] for i in ctx_at]
        return np.array([tree[n] for n in tree_names] + ctx, dtype=np.float32)


def context_positions(depth: int, names: list[str] | None) -> list[int] | None:
    """Where each named context input sits in `context_names(depth)` (None: all of them, in order)."""
    if names is None:
        return None
    where = {n: i for i, n in enumerate(context_names(depth))}
    return [where[n] for n in names]
