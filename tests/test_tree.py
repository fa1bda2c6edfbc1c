"""Tree operations on hand-built trees (no model)."""
import math

import numpy as np
import pytest

from treegraft.prune import prune
from treegraft.tree import (MID, SMALL, DraftTree, add_child, ancestor_matrix, batch_layout, delete_subtree,
                            mid_pool, path_to, path_tokens, recompute_scores, reselection_rate,
                            small_pool, top_w, unvisited_closure)

L = math.log


def children(t: DraftTree, v: int) -> list[int]:
    return [c for c in np.flatnonzero(t.parent[: t.n] == v) if t.alive[c]]


def build():
    """root(100) -> a(1, .6) -> c(3, .5) -> e(5, .9)
                 -> b(2, .3) -> d(4, .8)"""
    t = DraftTree.new(100, capacity=32)
    a, _ = add_child(t, 0, 1, L(.6), SMALL, 1)
    b, _ = add_child(t, 0, 2, L(.3), SMALL, 1)
    c, _ = add_child(t, a, 3, L(.5), SMALL, 2)
    d, _ = add_child(t, b, 4, L(.8), SMALL, 2)
    e, _ = add_child(t, c, 5, L(.9), SMALL, 3)
    return t, (a, b, c, d, e)


def test_scores_are_path_products():
    t, (a, b, c, d, e) = build()
    assert math.exp(t.score[e]) == pytest.approx(.6 * .5 * .9)
    assert math.exp(t.score[d]) == pytest.approx(.3 * .8)
    assert t.depth[e] == 3 and t.parent[e] == c


def test_dedup_keeps_node_refreshes_p_and_marks_confirmation():
    t, (a, b, c, d, e) = build()
    n_before = t.n
    v, created = add_child(t, 0, 1, L(.9), MID, 4)
    assert (v, created) == (a, False) and t.n == n_before
    assert t.confirmed[a] == (1 << SMALL) | (1 << MID)
    recompute_scores(t)
    assert math.exp(t.score[e]) == pytest.approx(.9 * .5 * .9)
    siblings = [int(t.token[x]) for x in children(t, 0)]
    assert len(siblings) == len(set(siblings))


def test_pools_small_is_last_step_mid_is_unvisited():
    t, (a, b, c, d, e) = build()
    t.last_added = [e]
    assert small_pool(t).tolist() == [e]
    t.mid_visited[[0, a]] = True
    assert mid_pool(t).tolist() == [b, c, d, e]
    assert unvisited_closure(t, np.array([e])).tolist() == [c, e]  # c unvisited, a visited


def test_frontier_top_w_by_score_and_reselection():
    t, (a, b, c, d, e) = build()
    pool = np.array([a, b, c, d, e])
    f = top_w(t, pool, 2)
    assert f.tolist() == [a, c]  # .6, .3 (c) beats .27 (e) and .24 (d)
    assert reselection_rate(t, f, leaf_depth=3) == 1.0
    assert reselection_rate(t, np.array([e]), leaf_depth=3) == 0.0


def test_non_destructive_graft_keeps_subtree_overwrite_deletes_it():
    t, (a, b, c, d, e) = build()
    add_child(t, a, 7, L(.4), MID, 4)
    assert t.alive[[c, e]].all() and len(children(t, a)) == 2
    removed = delete_subtree(t, a)
    assert sorted(removed) == sorted([c, e, t.n - 1])
    assert not t.alive[[c, e]].any() and t.alive[a]
    assert children(t, a) == []
    v, created = add_child(t, a, 3, L(.5), MID, 5)  # the token can be grafted again after deletion
    assert created and v != c


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5, 9])
def test_prune_exact_budget_with_ancestor_closure(budget):
    t, nodes = build()
    kept = prune(t, budget)
    assert len(kept) == min(budget, 5)
    for v in kept:
        assert all(t.kept[u] for u in path_to(t, int(v)))
    scores = t.score[1:t.n]
    assert t.score[kept].min() >= np.sort(scores)[::-1][len(kept) - 1] - 1e-12


def test_prune_random_trees_respect_budget_and_closure():
    rng = np.random.default_rng(0)
    for trial in range(50):
        t = DraftTree.new(0, capacity=200)
        for _ in range(rng.integers(1, 150)):
            parent = int(rng.integers(0, t.n))
            add_child(t, parent, int(rng.integers(0, 50)), float(np.log(rng.uniform(.01, 1))), SMALL, 1)
        budget = int(rng.integers(1, 80))
        kept = prune(t, budget)
        assert len(kept) == min(budget, t.n - 1)
        assert all(t.kept[t.parent[v]] for v in kept)


def test_ancestor_matrix_and_layout():
    t, (a, b, c, d, e) = build()
    nodes = np.array([0, a, b, c, e])
    anc, depth = batch_layout(t, nodes)
    assert depth.tolist() == [0, 1, 1, 2, 3]
    want = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], bool)
    assert (anc == want).all()
    assert (ancestor_matrix(np.array([-1, 0, 1])) == np.tril(np.ones((3, 3), bool))).all()


def test_path_tokens_exclude_root():
    t, (a, b, c, d, e) = build()
    assert path_tokens(t, e, 10) == [1, 3, 5]
    assert path_tokens(t, e, 2) == [3, 5]
    assert path_tokens(t, 0, 5) == []
