"""The small drafter: matches, back-off, incremental update, cost."""

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
