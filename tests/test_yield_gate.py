"""The step-1 yield gate (treegraft/scheduler/online.py): the counterfactual of a call round, the gate's rule, and
the gated `treegraft` on real rounds (calls at step 1 only, the cost measured at load, output unchanged)."""
import numpy as np
import pytest

from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec, RoundOutcome, StepState, make_policy
from treegraft.scheduler.online import (DECAY, EXPLORE_FIRST, MIN_CALLS, PRIOR_ROUNDS, PRIOR_SD, Z, GatedPolicy, Yield,
                                       YieldGate, ngram_subtree, round_yield)
from treegraft.tree import MID, SMALL, DraftTree, add_child, proposed_by

L = np.log


def flat_cost(n: np.ndarray) -> np.ndarray:
    """T(n) = 20 ms + 1 ms a node."""
    return 20.0 + np.asarray(n, dtype=float)


def outcome(tree, kept, path, bonus, round_ms=30.0, mid_ms=2.0, row_ms=0.5, cut=None) -> RoundOutcome:
    """A verified call round; `cut`: the nodes all-small's cut would have verified (scripted; by default the n-gram
    nodes this round kept; `Pruner.cut_among` is tested in test_budget.py)."""
    tree.kept[kept] = True
    kept_small = [v for v in kept if proposed_by(tree, [v], SMALL)[0]]
    return RoundOutcome(tree, np.array(kept), path, bonus, round_ms, mid_ms, row_ms, flat_cost,
                        lambda t, nodes: np.array(kept_small if cut is None else cut, dtype=np.int64))


def call_tree():
    """root -> a (mid and n-gram) -> b (mid only) -> c (n-gram); root -> d (n-gram only)."""
    t = DraftTree.new(100, 16)
    a, _ = add_child(t, 0, 1, L(.5), MID, 1)
    add_child(t, 0, 1, L(.5), SMALL, 2)  # the n-gram drafter proposes a too: confirmed by both
    b, _ = add_child(t, a, 2, L(.5), MID, 1)
    c, _ = add_child(t, b, 3, L(.5), SMALL, 2)
    d, _ = add_child(t, 0, 4, L(.5), SMALL, 2)
    return t, (a, b, c, d)


def test_a_mid_only_node_on_the_path_ends_what_the_ngram_drafter_alone_would_have_accepted():
    t, (a, b, c, d) = call_tree()
    y = round_yield(outcome(t, [a, b, c, d], [0, a, b, c], bonus=7))
    assert y.tokens == 4 and y.tokens_without == 2  # a, b, c + bonus; without the mid: a + the target's own token
    # the parts: 2 ms of mid steps + T(4) - T(3) (b is the one mid-only node kept) + 2 tokens' rows
    assert y.ms == 30.0 and y.ms_without == pytest.approx(30.0 - (2.0 + 1.0 + 2 * 0.5))


def test_the_call_costs_its_own_parts_in_the_round():
    """The call's cost is this round's parts alone: a slower mid step or a bigger verified tree raises it."""
    t, (a, b, c, d) = call_tree()
    base = round_yield(outcome(t, [a, b, c, d], [0, a, b, c], bonus=7))
    slow = round_yield(outcome(t, [a, b, c, d], [0, a, b, c], bonus=7, mid_ms=6.0))
    assert base.ms_without - slow.ms_without == pytest.approx(4.0)
    fewer = round_yield(outcome(t, [a, b, c, d], [0, a, b, c], bonus=7, cut=[a]))  # all-small: 1 node, not 3
    assert fewer.tokens_without == base.tokens_without
    assert base.ms_without - fewer.ms_without == pytest.approx(2.0)  # T(4) - T(1) against T(4) - T(3)


def test_an_ngram_child_the_prune_left_out_counts_as_what_it_would_have_accepted():
    t, (a, b, c, d) = call_tree()
    e, _ = add_child(t, a, 9, L(.2), SMALL, 3)  # drafted by the n-gram drafter, not kept: all-small would verify it
    y = round_yield(outcome(t, [a, b, d], [0, a], bonus=9, cut=[a, d, e]))
    assert y.tokens == 2 and y.tokens_without == 3  # the path is the n-gram's, and so was its next token
    y = round_yield(outcome(t, [a, b, d], [0, a], bonus=5, cut=[a, d, e]))
    assert y.tokens_without == 2  # nothing left out matched: the same path
    y = round_yield(outcome(t, [a, b, d], [0, a], bonus=9))
    assert y.tokens_without == 2  # e left out of all-small's cut too: it would not have been verified either


def test_without_the_call_the_round_verifies_what_the_cut_makes_of_the_ngram_nodes_alone():
    t, (a, b, c, d) = call_tree()
    assert ngram_subtree(t).tolist() == [a, d]  # c is the n-gram's, but under the mid-only b
    given = []

    def all_of_them(tree, nodes):
        given.append(nodes.tolist())
        return nodes

    o = outcome(t, [a, b, c, d], [0, a, b, c], bonus=7)
    o.small_cut = all_of_them
    y = round_yield(o)
    assert given == [[a, d]] and y.tokens_without == 2  # a, then the target's token
    assert y.ms_without == pytest.approx(30.0 - (2.0 + (24.0 - 22.0) + 2 * 0.5))  # T(4) - T(2): 2 nodes more
    o.small_cut = lambda tree, nodes: nodes[nodes != a]  # an all-small cut would not have verified a
    assert round_yield(o).tokens_without == 1


NOTHING = Yield(tokens=2, ms=30.0, tokens_without=2, ms_without=25.0)  # a call that yields nothing, at 5 ms
PAYS = Yield(tokens=3, ms=30.0, tokens_without=1, ms_without=25.0)  # 3 tokens in 30 ms against 1 in 25 ms


def test_the_gate_closes_only_on_evidence_then_explores_and_reopens():
    gate = YieldGate()
    assert gate.margin is None and gate.wants_call()
    for _ in range(MIN_CALLS + 1):  # a few calls that yield nothing do not close it: the prior spread of a round
        assert gate.wants_call()
        gate.observe(True, NOTHING)
    assert gate.margin < 0 < gate.bound and gate.wants_call()
    calls = 0
    while gate.wants_call():  # the same evidence, repeated, does
        gate.observe(True, NOTHING)
        calls += 1
        assert calls < 20
    assert gate.bound < 0
    for wait in (EXPLORE_FIRST, 2 * EXPLORE_FIRST):  # closed, it still calls after a wait that doubles
        for _ in range(wait - 1):
            gate.observe(False, None)
            assert not gate.wants_call() or gate.since_call == wait - 1
        assert gate.wants_call()
        gate.observe(True, NOTHING)
        assert not gate.wants_call()
    for _ in range(3):  # calls that pay open it again
        gate.observe(True, PAYS)
    assert gate.bound > 0 and gate.wants_call() and gate.wait == EXPLORE_FIRST


def test_the_gate_bound_is_the_margin_plus_its_standard_error_over_the_decayed_rounds():
    rng = np.random.default_rng(0)
    gate, ys = YieldGate(), []
    for _ in range(12):
        y = Yield(int(rng.integers(1, 5)), float(rng.uniform(20, 35)), int(rng.integers(1, 4)), float(rng.uniform(18, 30)))
        gate.observe(True, y)
        ys.append(y)
    y = np.array([(r.tokens, r.ms, r.tokens_without, r.ms_without) for r in ys])
    w = DECAY ** np.arange(len(y))[::-1]
    a, t, a0, t0 = w @ y
    assert gate.margin == pytest.approx(a / t - a0 / t0)
    x = (y[:, 0] - y[:, 2]) - a0 / t0 * (y[:, 1] - y[:, 3])
    assert (w @ x) / t == pytest.approx(gate.margin)  # the margin is the mean x over the mean t
    spread = w @ (x - (w @ x) / w.sum()) ** 2
    sd = np.sqrt((PRIOR_ROUNDS * PRIOR_SD ** 2 + spread) / (PRIOR_ROUNDS + w.sum()))
    se = sd / np.sqrt(w.sum() ** 2 / (w @ w)) / (t / w.sum())
    assert gate.bound == pytest.approx(gate.margin + Z * se)


def test_the_gated_policy_decides_step_one_and_leaves_the_rest_to_the_ngram_drafter():
    policy = make_policy(MethodSpec("treegraft"), DraftingConfig(mid_gate="yield"), "models/none/scheduler.json")
    assert isinstance(policy, GatedPolicy) and policy.calls_every_round
    t = DraftTree.new(100, 8)
    for k in range(1, 6):
        d = policy.decide(StepState(k=k, depth=5, tree=t))
        assert d.action == (MID if k == 1 else SMALL)  # no evidence yet: step 1 calls


def test_a_call_rounds_first_mid_lead_steps_are_the_mids_and_a_round_without_a_call_has_none():
    policy = make_policy(MethodSpec("treegraft"), DraftingConfig(mid_gate="yield", mid_lead=2), None)
    t = DraftTree.new(100, 8)
    policy.start_round()  # no evidence yet: step 1 calls, so step 2 is the mid's too
    assert [policy.decide(StepState(k=k, depth=5, tree=t)).action for k in range(1, 6)] == [MID, MID, SMALL, SMALL, SMALL]
    # four call rounds that measured a loss close the gate
    for _ in range(4):
        policy.gate.observe(True, Yield(tokens=1, ms=40.0, tokens_without=3, ms_without=30.0))
    policy.start_round()
    assert not policy.gate.wants_call()
    assert [policy.decide(StepState(k=k, depth=5, tree=t)).action for k in range(1, 6)] == [SMALL] * 5


def test_gated_treegraft_calls_at_step_one_only_measures_its_cost_and_keeps_the_output(tiny_head_engine):
    engine = tiny_head_engine
    drafting = DraftingConfig(depth=3, width=3, top_k=2, budget=8, mid_gate="yield")
    ids = engine.encode(("t3 t5 t7 t3 t5 t9 t2",))
    gen = GenerationConfig(max_new_tokens=16)
    saved = dict(engine.timing_ms)
    try:
        engine.timing_ms = {"target": 0.0, "mid": 0.0}
        ar = engine.generate(ids, MethodSpec("ar"), drafting, gen)
        res = engine.generate(ids, MethodSpec("treegraft"), drafting, gen)
        assert res.new_tokens == ar.new_tokens
        assert engine.timing_ms["call"] > 0  # measured before the generation, off the clock
        steps = [s for r in res.rounds for s in r.steps]
        assert all(s.action == "small" for s in steps if s.k > 1)
        called = [r.steps[0].action == "mid" for r in res.rounds]
        assert all(called[:MIN_CALLS])
        assert all(r.steps[0].margin is not None for r in res.rounds[1:])  # the gate's margin from round 2 on
        led = engine.generate(ids, MethodSpec("treegraft"), drafting.model_copy(update={"mid_lead": 2}), gen)
        assert led.new_tokens == ar.new_tokens
        for r in led.rounds:  # a call round's step 2 is the head's too, a round without one has no head step
            lead = ["mid", "mid"] if r.steps[0].action == "mid" else ["small", "small"]
            assert [s.action for s in r.steps] == lead + ["small"] * (len(r.steps) - 2)
        assert any(r.steps[0].action == "mid" for r in led.rounds)
    finally:
        engine.timing_ms = saved
