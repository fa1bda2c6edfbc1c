"""The small drafter: matches, back-off, incremental update, cost."""

import math

import pytest

from treegraft.drafters.ngram import BACKOFF, NgramIndex


def test_longest_match_wins_and_probabilities_from_counts():
    idx = NgramIndex(3)
    idx.extend([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3, 8])
    # "1 2 3" was followed by 9 and 7; "2 3" additionally by 8
    out = idx.propose([1, 2, 3], k=2)
    assert [t for t, _ in out] == [7, 9]  # equal counts: most recent first
    assert [p for _, p in out] == pytest.approx([0.5, 0.5])


def test_backoff_fills_with_shorter_suffix_scaled():
    idx = NgramIndex(3)
    idx.extend([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3, 8])
    out = dict(idx.propose([1, 2, 3], k=3))
    assert out[8] == pytest.approx(BACKOFF * 1 / 3)


def test_no_match_gives_nothing():
    idx = NgramIndex(3)
    idx.extend([1, 2, 3])
    assert idx.propose([42], k=4) == []


def test_context_tail_is_used_for_short_paths():
    idx = NgramIndex(4)
    idx.extend([5, 6, 7, 8, 5, 6])
    # an empty path: the suffix is the context's own end ("5 6") -> 7
    assert idx.propose([], k=1)[0][0] == 7


def test_incremental_update_equals_bulk():
    toks = [1, 2, 1, 3, 1, 2, 4, 1, 2, 1, 3]
    bulk = NgramIndex(3)
    bulk.extend(toks)
    inc = NgramIndex(3)
    for i in range(0, len(toks), 3):
        inc.extend(toks[i:i + 3])
    assert inc.tokens == bulk.tokens
    for n in range(1, 4):
        assert dict(inc.tables[n]) == dict(bulk.tables[n])


class CountingTable(dict):
    """A table that counts its look-ups (the work a proposal does, measured without a clock)."""

    lookups = 0

    def get(self, key, default=None):
        CountingTable.lookups += 1
        return super().get(key, default)


def test_draft_step_work_does_not_grow_with_the_context():
    """A draft step (W = 8 frontier nodes) does at most n_max table look-ups per node, whether the context
    holds 200 or 20,000 tokens: no rescan. (Its wall time is reported by the benchmark's profile, per
    machine; a test asserts no timing.)"""
    import random

    rng = random.Random(0)
    tails = [[rng.randrange(300) for _ in range(rng.randrange(1, 6))] for _ in range(8)]
    work = {}
    for length in (200, 20_000):
        idx = NgramIndex(5)
        idx.extend([rng.randrange(300) for _ in range(length)])
        idx.tables = [CountingTable(t) for t in idx.tables]
        CountingTable.lookups = 0
        proposals = [idx.propose(tail, k=4) for tail in tails]
        assert any(proposals)
        work[length] = CountingTable.lookups
    assert work[200] <= 8 * 5 and work[20_000] <= 8 * 5


def _after_a_mid_step_at_the_root(small_pool: str):
    """A round whose step 1 was the mid's: its 2 guesses under the root (tokens 90, 91, both wrong), the root a
    graft site. Then one small step over a context that says 3 follows 1 2."""
    from types import SimpleNamespace

    from treegraft.config import DraftingConfig
    from treegraft.drafters.ngram import SmallDrafter
    from treegraft.tree import MID, SMALL, DraftTree, add_child

    index = NgramIndex(3)
    index.extend([1, 2, 3, 4, 1, 2])  # the root is the last token, 2
    tree = DraftTree.new(2, capacity=64)
    tree.graft_site[0] = True
    tree.last_added = [add_child(tree, 0, tok, math.log(0.4), MID, 1)[0] for tok in (90, 91)]
    s = SimpleNamespace(drafting=DraftingConfig(small_pool=small_pool, span_max=0), ngram=index)
    SmallDrafter().step(s, tree, 2)
    return {int(tree.token[v]) for v in range(1, tree.n) if tree.parent[v] == 0 and tree.drafter[v] == SMALL}


def test_a_mid_step_first_does_not_take_the_root_from_the_ngram_drafter():
    # shared tree (default): the n-gram drafter still proposes at the mid's graft site, beside the mid's guesses
    assert _after_a_mid_step_at_the_root("shared") == {3}
    # the paper's pool N_k: only the mid's children are extended, the copy at the root is never proposed
    assert _after_a_mid_step_at_the_root("paper") == set()


def test_small_sites_are_n_k_plus_unexpanded_graft_sites():
    from treegraft.tree import MID, SMALL, DraftTree, add_child, small_pool, small_sites

    tree = DraftTree.new(0, capacity=16)
    a, _ = add_child(tree, 0, 5, math.log(0.5), SMALL, 1)
    b, _ = add_child(tree, a, 6, math.log(0.5), MID, 2)
    tree.graft_site[[0, a]] = True
    tree.small_expanded[0] = True  # step 1 (small) expanded the root
    tree.last_added = [b]
    assert small_pool(tree).tolist() == [b]
    assert small_sites(tree).tolist() == [a, b]  # a: the mid grafted there, the n-gram drafter never expanded it
