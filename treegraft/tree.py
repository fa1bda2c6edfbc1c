"""The shared draft tree as flat parallel arrays, and the pure operations of SPEC 2.

Node 0 is the root r: the last committed token, whose target output is the
distribution of the first new token. A node's parent always has a smaller index
(children are appended), so index order is a topological order: scores are
recomputed top-down by one pass and any index-sorted subset lists parents first.

Scores are in log space: `logp[v] = log p(v)`, `score[v] = log s(v)` = the sum of
`logp` over the path from r (excluded) to v. The tree knows nothing of models.

Two rules set p(v) (`DraftingConfig.scores`). "paper" (SPEC 2.2): p(v) is the last
drafter's own probability, so a mid refresh replaces the n-gram drafter's count
ratio with the mid's q. "calibrated": every drafter's own log p is kept
(`raw[v, drafter]`, NaN where a drafter has not scored v) and p(v) is
`calibration(raw[v])`, the probability that the target accepts v given its parent
(learned online from verified rounds, `prune.AcceptanceModel`): one scale for both
drafters, where a mid score adds evidence instead of replacing it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROOT_DRAFTER, SMALL, MID = -1, 0, 1


@dataclass
class DraftTree:
    token: np.ndarray  # [cap] int64
    parent: np.ndarray  # [cap] int32, -1 for the root
    depth: np.ndarray  # [cap] int16
    logp: np.ndarray  # [cap] float64, log p(v) (0 at the root)
    score: np.ndarray  # [cap] float64, log s(v)
    drafter: np.ndarray  # [cap] int8, who created the node
    step: np.ndarray  # [cap] int8, the draft step that added it (0: root)
    confirmed: np.ndarray  # [cap] uint8, bit d set when drafter d proposed this token here
    mid_visited: np.ndarray  # [cap] bool, in P: the mid drafter has evaluated this node
    graft_site: np.ndarray  # [cap] bool, chosen as frontier by a mid step
    small_expanded: np.ndarray  # [cap] bool, chosen as frontier by a small step
    alive: np.ndarray  # [cap] bool, False once deleted by an overwrite (the w/o-ND ablation)
    kept: np.ndarray  # [cap] bool, survives the prune to B_ver
    raw: np.ndarray = None  # [cap, 2] float64, each drafter's own log p (columns SMALL, MID; NaN: not scored)
    calibration: object = None  # "calibrated" scores: .one(small, mid) / .many(raw [n, 2]) -> log p (None: paper)
    keep_budget: int | None = None  # this round's B_ver: a step expands only what the prune could keep (None: all)
    n: int = 1
    child_of: dict = field(default_factory=dict)  # (parent, token) -> node, live children only
    last_added: list = field(default_factory=lambda: [0])  # N_k: the nodes the previous step produced

    @classmethod
    def new(cls, root_token: int, capacity: int) -> "DraftTree":
        def arr(dtype, fill=0):
            return np.full(capacity, fill, dtype=dtype)

        t = cls(token=arr(np.int64), parent=arr(np.int32, -1), depth=arr(np.int16), logp=arr(np.float64),
                score=arr(np.float64), drafter=arr(np.int8, ROOT_DRAFTER), step=arr(np.int8),
                confirmed=arr(np.uint8), mid_visited=arr(bool), graft_site=arr(bool), small_expanded=arr(bool),
                alive=arr(bool), kept=arr(bool), raw=np.full((capacity, 2), np.nan))
        t.token[0], t.alive[0] = root_token, True
        return t

    def live(self) -> np.ndarray:
        """Indices of live nodes, root included, in index (topological) order."""
        return np.flatnonzero(self.alive[: self.n])

    def max_leaf_depth(self) -> int:
        return int(self.depth[: self.n][self.alive[: self.n]].max())


def add_child(tree: DraftTree, parent: int, token: int, logp: float, drafter: int, step: int) -> tuple[int, bool]:
    """Graft one proposal under `parent`; returns (node, created).

    Non-destructive: an existing child with the same token is kept, its p refreshed
    with this drafter's probability (paper rule) or with both drafters' evidence
    (calibrated) and marked as confirmed by it, so siblings always carry distinct tokens.
    """
    key = (parent, token)
    node = tree.child_of.get(key)
    if node is not None:
        _set_one(tree, node, drafter, logp)
        tree.confirmed[node] |= 1 << drafter
        return node, False
    if tree.n >= len(tree.token):
        raise OverflowError("draft tree capacity exceeded")
    v = tree.n
    tree.n += 1
    tree.token[v], tree.parent[v], tree.depth[v] = token, parent, tree.depth[parent] + 1
    _set_one(tree, v, drafter, logp)
    tree.score[v] = tree.score[parent] + tree.logp[v]
    tree.drafter[v], tree.step[v], tree.confirmed[v], tree.alive[v] = drafter, step, 1 << drafter, True
    tree.child_of[key] = v
    return v, True


def set_drafter_logp(tree: DraftTree, nodes: np.ndarray, drafter: int, logp: np.ndarray) -> None:
    """A drafter's own log p for nodes [n]; p(v) by the tree's rule (module docstring). Scores are the
    caller's to recompute."""
    tree.raw[nodes, drafter] = logp
    tree.logp[nodes] = logp if tree.calibration is None else tree.calibration.many(tree.raw[nodes])


def _set_one(tree: DraftTree, v: int, drafter: int, logp: float) -> None:
    """set_drafter_logp for one node (the drafters' hot path: no arrays built)."""
    tree.raw[v, drafter] = logp
    if tree.calibration is None:
        tree.logp[v] = logp
    else:
        tree.logp[v] = tree.calibration.one(float(tree.raw[v, 0]), float(tree.raw[v, 1]))


def proposed_by(tree: DraftTree, nodes, drafter: int) -> np.ndarray:
    """[len(nodes)] bool: the drafter proposed each node's token there (created it or confirmed it)."""
    return (tree.confirmed[np.asarray(nodes, dtype=np.int64)] & (1 << drafter)) != 0


def node_levels(tree: DraftTree, nodes: np.ndarray, evaluated: set[int]) -> np.ndarray:
    """[n] level of each node (index order): 0 if its parent was evaluated by the mid (or it is the root),
    else one more than its parent's (the parent is then in `nodes`, at an earlier index). A draft head runs
    one forward per level (drafters/head.py); `mid_levels` bounds them (drafters/graft.py)."""
    level = {}
    out = np.zeros(len(nodes), dtype=np.int64)
    for i, v in enumerate(nodes.tolist()):
        p = int(tree.parent[v])
        level[v] = 0 if p < 0 or p in evaluated else level[p] + 1
        out[i] = level[v]
    return out


def recompute_scores(tree: DraftTree) -> None:
    """s(v) = s(parent) * p(v), top-down (index order is topological)."""
    score, logp, parent = tree.score, tree.logp, tree.parent
    for v in range(1, tree.n):
        score[v] = score[parent[v]] + logp[v]


def delete_subtree(tree: DraftTree, v: int) -> list[int]:
    """Remove every descendant of v (v itself stays). Only the w/o-ND ablation does this."""
    doomed = np.zeros(tree.n, dtype=bool)
    alive = tree.alive
    for u in range(v + 1, tree.n):
        p = tree.parent[u]
        if alive[u] and (p == v or doomed[p]):
            doomed[u] = True
    removed = np.flatnonzero(doomed).tolist()
    for u in removed:
        alive[u] = False
        tree.child_of.pop((int(tree.parent[u]), int(tree.token[u])), None)
    return removed


# --- candidate pools and frontier (SPEC 2.1) ---------------------------------------------------

def small_pool(tree: DraftTree) -> np.ndarray:
    """C_k for a small step: N_k, the live nodes the previous step produced (N_1 = {r})."""
    return np.array([v for v in tree.last_added if tree.alive[v]], dtype=np.int64)


def small_sites(tree: DraftTree) -> np.ndarray:
    """C_k for a small step on a shared tree (`DraftingConfig.small_pool` = "shared"): N_k plus every live graft
    site the small drafter has not expanded. With the paper's N_k alone, a mid step at k = 1 leaves the n-gram
    drafter only the mid's children to extend: it never proposes at the root, so a weak mid's guesses there
    displace the n-gram drafter's copy (measured: trans-02, A 1.3 -> 0.07). Here both drafters propose at
    every graft site, side by side; top-W by s(v) still bounds a step."""
    n = tree.n
    sites = np.flatnonzero(tree.graft_site[:n] & tree.alive[:n] & ~tree.small_expanded[:n])
    return np.union1d(small_pool(tree), sites)


def mid_pool(tree: DraftTree) -> np.ndarray:
    """C_k for a mid step (expanded graft sites): every live node the mid has not evaluated, root included."""
    n = tree.n
    return np.flatnonzero(tree.alive[:n] & ~tree.mid_visited[:n])


def unvisited_closure(tree: DraftTree, pool: np.ndarray) -> np.ndarray:
    """pool plus its ancestors the mid has not evaluated: what a mid forward must feed to score pool."""
    need = set(int(v) for v in pool)
    for v in list(need):
        p = int(tree.parent[v])
        while p >= 0 and not tree.mid_visited[p] and p not in need:
            need.add(p)
            p = int(tree.parent[p])
    return np.array(sorted(need), dtype=np.int64)


def top_w(tree: DraftTree, pool: np.ndarray, width: int) -> np.ndarray:
    """F_k: the top-W of the pool by path score (ties: shallower first, then older)."""
    if len(pool) == 0:
        return pool
    order = np.lexsort((pool, tree.depth[pool], -tree.score[pool]))
    return pool[order[:width]]


def reselection_rate(tree: DraftTree, frontier: np.ndarray, leaf_depth: int) -> float:
    """Share of frontier nodes shallower than the deepest leaf (the mid went back to an earlier site)."""
    if len(frontier) == 0:
        return 0.0
    return float(np.mean(tree.depth[frontier] < leaf_depth))


# --- attention layout of a set of nodes (SPEC 3) -----------------------------------------------

def ancestor_matrix(parent_rows: np.ndarray) -> np.ndarray:
    """[n, n] bool: row i sees column j iff j is i or an ancestor of i; parent_rows[i] < i or -1."""
    n = len(parent_rows)
    anc = np.zeros((n, n), dtype=bool)
    for i in range(n):
        p = parent_rows[i]
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc


def rows_of(nodes: np.ndarray, tree_size: int) -> np.ndarray:
    """[tree_size] map node -> row in `nodes` (-1 when absent)."""
    row = np.full(tree_size, -1, dtype=np.int64)
    row[nodes] = np.arange(len(nodes))
    return row


def batch_layout(tree: DraftTree, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For nodes (index order): the [n, n] in-batch visibility and the [n] node depths."""
    row = rows_of(nodes, tree.n)
    parents = tree.parent[nodes]
    parent_rows = np.where(parents >= 0, row[np.maximum(parents, 0)], -1)
    return ancestor_matrix(parent_rows), tree.depth[nodes].astype(np.int64)


def path_to(tree: DraftTree, v: int) -> list[int]:
    """Nodes from the root (included) down to v."""
    path = []
    while v >= 0:
        path.append(int(v))
        v = int(tree.parent[v])
    return path[::-1]


def path_tokens(tree: DraftTree, v: int, limit: int) -> list[int]:
    """The last `limit` drafted tokens on the path to v (the root's token, already committed, excluded)."""
    out = []
    while v > 0 and len(out) < limit:
        out.append(int(tree.token[v]))
        v = int(tree.parent[v])
    return out[::-1]
