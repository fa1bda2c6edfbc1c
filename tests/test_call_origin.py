"""scripts/call_origin.py's counts of what a head call adds, on a hand-made round (no model, no clock)."""
import math

import pytest

from treegraft.trace import RoundTrace, StepTrace, TreeSnapshot
from treegraft.tree import MID, SMALL, DraftTree, add_child


@pytest.fixture(scope="module")
def origin(load_script):
    return load_script("call_origin").call_origin


def call_round() -> RoundTrace:
    """Root 5. Step 1 (head): 6 and 7 under the root; step 2 (head): 8 under 6; step 3 (n-gram): 6 again under
    the root (confirming it) and 9 under 8. Every node verified; the target accepted 6, 8 (not 9)."""
    tree = DraftTree.new(5, capacity=16)
    a, _ = add_child(tree, 0, 6, math.log(0.6), MID, 1)
    b, _ = add_child(tree, 0, 7, math.log(0.3), MID, 1)
    c, _ = add_child(tree, a, 8, math.log(0.5), MID, 2)
    again, new = add_child(tree, 0, 6, math.log(0.9), SMALL, 3)
    assert (again, new) == (a, False)
    d, _ = add_child(tree, c, 9, math.log(0.7), SMALL, 3)
    tree.kept[[0, a, b, c, d]] = True
    steps = [StepTrace(1, "mid"), StepTrace(2, "mid"), StepTrace(3, "small")]
    return RoundTrace(index=0, prefix_len=10, tree=TreeSnapshot.of(tree), bonus_token=4, steps=steps,
                      accepted_path=[0, a, c], accepted_tokens=[6, 8])


def test_counts_a_call_round_by_proposer_and_step(origin):
    out = origin([call_round()])
    assert out["rounds"] == 1
    assert out["accepted both step 1"] == 1  # 6: the head's, confirmed by the n-gram drafter
    assert out["accepted head step 2"] == 1  # 8: the head's alone
    assert out["verified head"] == 2 and out["verified both"] == 1 and out["verified n-gram"] == 1
    assert (out["tried head"], out["hit head"]) == (2, 1)  # 7 (parent the root) missed, 8 (parent 6) hit
    assert (out["tried n-gram"], out["hit n-gram"]) == (1, 0)  # 9: its parent 8 accepted, 9 not
    assert (out["tried both"], out["hit both"]) == (1, 1)  # 6
    # c(v) = pi(v) / pi(parent) from the tree's path scores (here the paper's rule: each node's own p)
    assert out["expected head"] == pytest.approx(0.3 + 0.5) and out["expected n-gram"] == pytest.approx(0.7)


def test_skips_rounds_without_a_step_1_call(origin):
    r = call_round()
    r.steps[0].action = "small"
    assert origin([r]) == {}
