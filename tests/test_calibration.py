"""Calibrated scores (tree.py, prune.AcceptanceModel): both drafters on one scale, a mid score adds evidence."""
import math

import numpy as np
import pytest
import torch

from treegraft.drafters.graft import refresh_children
from treegraft.drafters.neural import MidScores
from treegraft.prune import AcceptanceModel
from treegraft.tree import MID, SMALL, DraftTree, add_child


def small_tree(calibration=None) -> DraftTree:
    """root -> a (n-gram p 0.95) -> b (n-gram p 0.9), and root -> c (n-gram p 0.05)."""
    tree = DraftTree.new(0, capacity=8)
    tree.calibration = calibration
    a, _ = add_child(tree, 0, 10, math.log(0.95), SMALL, 1)
    add_child(tree, a, 11, math.log(0.9), SMALL, 2)
    add_child(tree, 0, 12, math.log(0.05), SMALL, 1)
    return tree


def weak_mid_scores(tree: DraftTree, batch: np.ndarray, vocab: int = 16) -> MidScores:
    """A mid that is confidently wrong: q(token 12 | anything) = 0.9, every other token shares the rest."""
    logq = torch.full((len(batch), vocab), math.log(0.1 / (vocab - 1)))
    logq[:, 12] = math.log(0.9)
    return MidScores(logq, torch.arange(vocab), torch.arange(vocab))


def learned(rounds: int = 300) -> AcceptanceModel:
    """A record where confident n-gram nodes are accepted 90% of the time whatever the mid says, and
    nodes the n-gram drafter rates low are rejected even when the mid likes them."""
    model, rng = AcceptanceModel(), np.random.default_rng(0)
    for _ in range(rounds):
        t = DraftTree.new(0, capacity=4)
        x, _ = add_child(t, 0, 10, math.log(0.95), SMALL, 1)
        add_child(t, 0, 10, math.log(0.01), MID, 1)  # the mid scores it low
        y, _ = add_child(t, 0, 12, math.log(0.05), SMALL, 1)
        add_child(t, 0, 12, math.log(0.9), MID, 1)  # ... and likes the wrong one
        model.update(t, np.array([x, y]), path=[0, x] if rng.random() < 0.9 else [0])
    return model


def test_raw_scores_keep_each_drafters_own_p_and_cells_bin_them():
    tree = small_tree()
    add_child(tree, 0, 10, math.log(0.3), MID, 3)  # the mid proposes the n-gram's token too
    assert np.exp(tree.raw[1]) == pytest.approx([0.95, 0.3])  # both kept
    assert np.isnan(tree.raw[2, MID]) and np.isnan(tree.raw[0]).all()  # not scored by the mid; the root by none
    bs, bm, prior = AcceptanceModel.cells(tree.raw[[1, 3]])
    assert bs.tolist() == [8, 2] and bm.tolist() == [4, AcceptanceModel.NONE]  # P_EDGES bins; NONE: not scored
    assert prior == pytest.approx([0.95, 0.05])  # the more confident drafter's p
    assert math.exp(tree.logp[1]) == pytest.approx(0.3)  # the paper's rule: the last drafter's p


def test_paper_rule_lets_a_weak_mid_overwrite_a_confident_ngram_branch():
    tree = small_tree()
    refresh_children(tree, np.array([0, 1]), weak_mid_scores(tree, np.array([0, 1])))
    assert math.exp(tree.logp[1]) < 0.01 and math.exp(tree.logp[3]) == pytest.approx(0.9)
    assert tree.score[3] > tree.score[2]  # the wrong branch now outranks the confident chain


def test_calibrated_scores_keep_what_the_record_earns():
    model = learned()
    tree = small_tree(model)
    before = tree.score.copy()
    refresh_children(tree, np.array([0, 1]), weak_mid_scores(tree, np.array([0, 1])))
    assert np.isfinite(tree.raw[[1, 2, 3], MID]).all()  # the mid's evidence was added
    c_good, c_bad = math.exp(tree.logp[1]), math.exp(tree.logp[3])
    assert c_good > 0.8 and c_bad < 0.2  # learned: the n-gram's confident node is accepted, the mid's pick is not
    assert tree.score[2] > tree.score[3] and tree.score[1] >= before[1] - 0.2
    # and the cost-aware cut reads the same quantity
    pi = model.path_acceptance(tree, np.array([1, 2, 3]))
    assert pi == pytest.approx(np.exp(tree.score[[1, 2, 3]]))


def test_calibration_starts_at_the_drafters_own_p():
    tree = small_tree(AcceptanceModel())  # no verification seen yet
    assert np.exp(tree.logp[1:4]) == pytest.approx([0.95, 0.9, 0.05])


@pytest.mark.slow  # ~2 minutes of trial rounds on the real pair
def test_live_rounds_with_a_mid_call_accept_no_less_than_without_it(engine, fp32_pair):
    """The issue's check on live generations of the real default pair: each sampled round drafted with small
    steps only, and with the mid at step k (k = 1..D), from the same state (mid_effect.py). With calibrated
    scores the rounds with a mid call accept on average at least as many tokens as without it. Fixed budget,
    so A depends on no timing."""
    from treegraft.config import with_overrides
    from treegraft.mid_effect import mid_effect, summary
    from treegraft.prompts import load_prompts

    drafting = with_overrides(fp32_pair.config.drafting, adaptive_budget=False, budget=15, scores="calibrated")
    prompts = [p for p in load_prompts("train") if p.category in ("chat", "code")][:2]
    saved = engine.state()
    try:
        result = mid_effect(engine, [engine.encode(p.messages) for p in prompts], drafting, rounds=4,
                            max_new_tokens=48)
    finally:
        engine.restore(saved)
    mean = summary(result)
    assert result["rounds"] >= 6 and set(result["A"]) == {"none", "k=1", "k=2", "k=3", "k=4", "k=5"}
    assert mean["mid"] >= mean["none"] - 0.05, mean


def test_trace_keeps_each_drafters_own_p_and_reads_older_traces():
    from dataclasses import asdict

    from treegraft.trace import RoundTrace, TreeSnapshot, round_from_dict
    from ui.tree_figure import hover

    tree = small_tree(learned())
    add_child(tree, 0, 10, math.log(0.01), MID, 2)
    snap = TreeSnapshot.of(tree)
    assert snap.p_small[1] == pytest.approx(0.95) and snap.p_mid[1] == pytest.approx(0.01)
    assert snap.p_small[0] is None and snap.p_mid[2] is None
    assert "own p: n-gram 0.950, mid 0.010" in hover(snap, 1, {})
    old = asdict(RoundTrace(index=0, prefix_len=3, tree=snap, bonus_token=1))
    del old["tree"]["p_small"], old["tree"]["p_mid"]  # a trace saved before calibrated scores
    again = round_from_dict(old)
    assert again.tree.p_small is None and "own p" not in hover(again.tree, 1, {})


def test_one_node_calibration_equals_the_batched_one():
    model = learned()
    rng = np.random.default_rng(1)
    raw = np.log(rng.uniform(0.001, 1.0, size=(200, 2)))
    raw[rng.random(200) < 0.3, 0] = np.nan
    raw[rng.random(200) < 0.3, 1] = np.nan
    raw[0] = [np.log(0.9), np.log(0.05)]  # exactly on bin edges
    raw[raw[:, 0] != raw[:, 0], 1] = np.where(np.isnan(raw[raw[:, 0] != raw[:, 0], 1]), np.log(0.5),
                                              raw[raw[:, 0] != raw[:, 0], 1])  # every node scored by someone
    one = [model.one(s, m) for s, m in raw]
    assert one == pytest.approx(model.many(raw).tolist())


def test_a_probe_is_the_root_then_a_chain_of_one_token():
    """The calibration's probe trees (prune.probe_chain, also scripts/verify_parts.py's): n nodes, each the child of
    the one before."""
    from treegraft.prune import probe_chain

    chain = probe_chain(7, 3)
    assert chain.n == 4 and chain.parent[:4].tolist() == [-1, 0, 1, 2]
    assert chain.token[:4].tolist() == [7] * 4 and chain.depth[:4].tolist() == [0, 1, 2, 3]
    assert probe_chain(7, 0).n == 1
