"""The cost-aware verification budget (treegraft/prune.py): pure parts, then wired into the engine."""
import copy
import math
from contextlib import contextmanager

import numpy as np
import pytest

from treegraft.prune import AcceptanceModel, Pruner, VerifyCost, choose, probe_sizes
from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import MethodSpec
from treegraft.tree import MID, SMALL, DraftTree, add_child


def cost(table: dict) -> VerifyCost:
    c = VerifyCost()
    for n, ms in table.items():
        c.observe(n, ms)
    return c


def chain_tree(ps, drafter=SMALL) -> DraftTree:
    tree = DraftTree.new(0, capacity=len(ps) + 2)
    for i, p in enumerate(ps):
        add_child(tree, i, 100 + i, math.log(p), drafter, 1)
    return tree


def test_flat_cost_keeps_every_node():
    order, _ = choose(np.array([0.5, 0.2, 0.01]), cost({0: 50, 1: 50, 8: 50}))
    assert sorted(order.tolist()) == [0, 1, 2]


def test_expensive_verification_needs_likely_tokens():
    steep = cost({0: 50, 1: 100, 8: 100})  # one node costs one extra decoding step
    assert len(choose(np.array([0.2, 0.1, 0.1]), steep)[0]) == 0  # E = 0.4 < 1: a plain step
    assert len(choose(np.array([0.9, 0.8, 0.7]), steep)[0]) == 3  # E = 2.4 > 1


def test_time_is_priced_at_the_rounds_own_rate():
    curve = cost({0: 50, 1: 55, 3: 65, 7: 85})  # 5 ms a node
    pi = np.array([0.6, 0.3, 0.15, 0.08])
    assert len(choose(pi, curve)[0]) == 3  # at plain decoding's rate a node pays from pi 0.1 ...
    assert len(choose(pi, curve, rate=2 / 50)[0]) == 2  # ... at twice that rate from pi 0.2
    assert len(choose(pi, curve, rate=1 / 50)[0]) == len(choose(pi, curve)[0])  # rate 1 / T(0): the same rule


def test_the_rounds_rate_is_learned_from_committed_rounds():
    pruner, tree = Pruner(), chain_tree([0.9, 0.9])
    assert pruner.rate is None
    for _ in range(30):  # rounds of 3 tokens (2 accepted + the bonus) in 60 ms
        pruner.learn(tree, np.array([1, 2]), [0, 1, 2], 50.0, None, 63, None, round_ms=60.0)
    assert pruner.rate == pytest.approx(3 / 60)
    for _ in range(30):  # then rounds of one token in 60 ms: the recent ones dominate
        pruner.learn(tree, np.array([1, 2]), [0], 50.0, None, 63, None, round_ms=60.0)
    assert pruner.rate < 1.2 / 60


def test_drafts_are_sized_to_what_the_cut_verifies():
    pruner = Pruner()
    pruner.verify_cost = cost({0: 50.0, 63: 680.0})  # 10 ms a node: at 1 / T(0) a node pays from pi 0.2
    assert pruner.draft_budget(15) == 15  # no rounds yet: B_ver on this host

    def rounds(p, n=10):
        tree = chain_tree([p] * 12)  # pi = p, p^2, ...
        for _ in range(n):
            kept = pruner.select(tree, 15, adaptive=True)
            pruner.learn(tree, kept, [0, *kept.tolist()] if p > 0.9 else [0, 1], 50.0, None, 15, None)
        return len(kept)

    assert rounds(0.5) == 2  # 0.5, 0.25 pay; 0.125 does not
    assert pruner.draft_budget(15) == 3  # the bucket above what the cut verified
    assert pruner.draft_budget(1) == 1  # never above B_ver
    assert rounds(0.97, n=20) == 12  # the cut keeps every node it is given: drafts may grow to B_ver again
    assert pruner.draft_budget(15) == 15


def test_cost_curve_is_interpolated_and_never_decreasing():
    c = cost({0: 50, 2: 90, 4: 80, 8: 100})  # 2 and 4 violate monotonicity: pooled to their mean, 85
    t = c(np.arange(9))
    assert t[0] == 50 and t[1] == pytest.approx(67.5) and t[4] == pytest.approx(85) and np.all(np.diff(t) >= 0)
    assert probe_sizes(8) == [0, 1, 3, 5, 7, 8] and probe_sizes(63) == [0, 1, 3, 5, 7, 11, 15, 23, 31, 47, 63]
    assert not VerifyCost() and not cost({0: 50})


def test_b_ver_follows_the_measured_cost_curve():
    """Trees sized to the host: B_ver shrinks to the largest n with T(n) <= cap x T(0)."""
    from treegraft.prune import Pruner

    steep, flat = Pruner(), Pruner()
    for n, ms in {0: 100.0, 1: 110.0, 3: 120.0, 7: 155.0, 11: 158.0, 15: 190.0, 31: 240.0, 63: 330.0}.items():
        steep.verify_cost.observe(n, ms)  # a 2-core CPU in fp32
    for n, ms in {0: 30.0, 7: 31.0, 15: 33.0, 31: 36.0, 63: 40.0}.items():
        flat.verify_cost.observe(n, ms)  # nearly flat (a GPU, fast bf16 units)
    # 11 nodes fit under the cap (a half-octave probe bucket), 15 do not; B_ver moves between probe buckets
    assert steep.host_budget(63, 1.6) == 11 and steep.host_budget(63, 2.0) == 15
    stepped = Pruner()
    for n, ms in {0: 100.0, 1: 110.0, 3: 120.0, 7: 155.0, 9: 158.0, 15: 190.0, 31: 240.0, 63: 330.0}.items():
        stepped.verify_cost.observe(n, ms)
    assert stepped.host_budget(63, 1.6) == 7  # T(11) interpolates to 169 > 160: the bucket below
    assert flat.host_budget(63, 1.6) == 63 and flat.host_budget(20, 1.6) == 20
    assert steep.host_budget(63, None) == 63 and Pruner().host_budget(63, 1.6) == 63  # off / not measured


def test_path_acceptance_multiplies_down_the_path_and_choice_is_ancestor_closed():
    tree = chain_tree([0.9, 0.9, 0.9])
    add_child(tree, 1, 7, math.log(0.95), MID, 2)  # a sibling branch under node 1
    nodes = np.arange(1, tree.n)
    pi = AcceptanceModel().path_acceptance(tree, nodes)  # no observations yet: the drafters' own p
    assert pi == pytest.approx([0.9, 0.81, 0.729, 0.855])
    order, _ = choose(pi, cost({0: 50, 1: 60, 8: 60}))
    for n in range(1, len(order) + 1):
        chosen = set(nodes[order[:n]].tolist()) | {0}
        assert all(tree.parent[v] in chosen for v in chosen if v)


def test_acceptance_is_learned_from_verifications():
    model, tree = AcceptanceModel(), chain_tree([0.95])
    nodes = np.array([1])
    assert model.conditional(tree, nodes)[0] == pytest.approx(0.95)
    for _ in range(40):
        model.update(tree, nodes, path=[0])  # the n-gram's confident guess keeps being rejected
    assert model.conditional(tree, nodes)[0] < 0.2
    for _ in range(200):
        model.update(tree, nodes, path=[0, 1])
    assert model.conditional(tree, nodes)[0] > 0.8


def test_a_drafters_overconfidence_learned_in_one_cell_moves_the_cells_not_yet_seen():
    model, seen = AcceptanceModel(), chain_tree([0.95])
    unseen = chain_tree([0.3])  # another bin of the n-gram drafter's p: no trial of its own yet
    mid_node = DraftTree.new(0, capacity=2)
    add_child(mid_node, 0, 5, math.log(0.3), MID, 1)  # a mid-only node: another proposer
    nodes = np.array([1])
    assert model.conditional(unseen, nodes)[0] == pytest.approx(0.3)  # no record: the drafter's own p
    for i in range(60):  # the n-gram's 0.95 guesses are accepted half of the time
        model.update(seen, nodes, path=[0, 1] if i % 2 else [0])
    ratio = model.ratio
    assert 0.5 < ratio[0] < 0.7 and ratio[1] == pytest.approx(1.0)
    assert model.conditional(unseen, nodes)[0] == pytest.approx(0.3 * ratio[0])  # prior scaled; no trials here
    assert model.conditional(mid_node, nodes)[0] == pytest.approx(0.3)  # the mid's record is its own
    assert math.exp(model.one(math.log(0.3), math.nan)) == pytest.approx(0.3 * ratio[0])  # the per-node path agrees


@pytest.fixture
def pair_drafting():
    # all D steps a round: the depth gate's choice follows measured ms, and these tests compare trees across runs
    return load_pair("default").drafting.model_copy(update={"adaptive_budget": True, "depth_gate": "off"})


@contextmanager
def cost_curve(engine, ms: dict, pinned: bool = False):
    """Run with this verification cost curve, then restore the engine's own. pinned: the rounds do not
    re-measure it (the real times would otherwise replace the curve under test after the first round)."""
    pruner = engine.pruner
    fields = ("verify_cost", "probe_cost", "host_b", "chosen", "round_tokens", "round_ms")
    saved = {k: copy.deepcopy(getattr(pruner, k)) for k in fields}
    pruner.verify_cost, pruner.probe_cost, pruner.host_b = VerifyCost(), VerifyCost(), None  # B_ver reads this curve
    pruner.chosen.clear()  # what the cut verified under another curve does not size these drafts
    pruner.round_tokens = pruner.round_ms = 0.0
    pruner.verify_cost.ms = dict(ms)
    if pinned:
        pruner.verify_cost.observe = lambda n, ms: None
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(pruner, k, v)


def test_engine_verifies_the_root_alone_when_trees_cannot_pay(engine, pair_drafting):
    ids, gen = engine.encode("Count from one to twenty."), GenerationConfig(max_new_tokens=12)
    engine.pruner.idle = 0
    with cost_curve(engine, {0: 50.0, 1: 1e6}, pinned=True):
        res = engine.generate(ids, MethodSpec("all-small"), pair_drafting, gen)
    ar = engine.generate(ids, MethodSpec("ar"), pair_drafting, gen)
    assert res.new_tokens == ar.new_tokens
    from treegraft.prune import EXPLORE_AFTER

    drafted = [i for i, r in enumerate(res.rounds) if len(r.tree.token) > 1]
    explored = [i for i, r in enumerate(res.rounds) if sum(r.tree.kept) > 1]
    assert all(sum(r.tree.kept) == 1 for i, r in enumerate(res.rounds) if i not in explored)  # plain steps
    # ... except an exploration round after EXPLORE_AFTER idle rounds with drafted trees (re-measures T(n))
    assert explored == [d for j, d in enumerate(drafted) if (j + 1) % EXPLORE_AFTER == 0]


def test_engine_keeps_the_pruned_tree_when_verification_is_free(engine, pair_drafting):
    ids, gen = engine.encode("Count from one to twenty."), GenerationConfig(max_new_tokens=12)
    drafting = pair_drafting.model_copy(update={"verify_cost_cap": None})  # the cut alone (rounds re-measure T)
    record = copy.deepcopy(engine.pruner.acceptance)  # calibrated scores read it: both runs start from it
    with cost_curve(engine, {0: 50.0, 64: 50.0}, pinned=True):
        adaptive = engine.generate(ids, MethodSpec("all-small"), drafting, gen)
    engine.pruner.acceptance = record
    fixed = engine.generate(ids, MethodSpec("all-small"), pair_drafting.model_copy(update={"adaptive_budget": False}), gen)
    assert [sum(r.tree.kept) for r in adaptive.rounds] == [sum(r.tree.kept) for r in fixed.rounds]
    assert adaptive.new_tokens == fixed.new_tokens


def test_calibration_seeds_the_cost_curve_once_outside_the_clock(engine, pair_drafting):
    """The probe verifies chains of the probe sizes, all before the generation starts (its clock starts just
    before `Engine.start`). Checked by the order of events, not by how long anything takes."""
    ids, gen = engine.encode("Count from one to twenty."), GenerationConfig(max_new_tokens=6)
    events, verify, start = [], engine.target.verify, engine.start

    def recording_verify(tree, nodes, lead=None):
        events.append(("verify", len(nodes) - 1))
        return verify(tree, nodes, lead)

    def recording_start(*args, **kwargs):
        events.append(("start", None))
        return start(*args, **kwargs)

    engine.target.verify, engine.start = recording_verify, recording_start
    try:
        with cost_curve(engine, {}):
            res = engine.generate(ids, MethodSpec("all-small"), pair_drafting, gen)
            probes = probe_sizes(pair_drafting.budget)
            assert set(probes) <= set(engine.pruner.verify_cost.ms)  # rounds may add the sizes they verified
            host = engine.host_costs(pair_drafting)  # what reports and the app show: the probes' curve only
            assert sorted(host["verify_ms"]) == [n + 1 for n in probes] and host["b_ver"] in probes
            first_start = events.index(("start", None))
            assert sorted({n for _, n in events[:first_start]}) == probes  # every probe before the start
            from treegraft.engine import thread_candidates

            # a warm-up, then three interleaved passes over every size under each candidate thread count
            assert len(events[:first_start]) == 1 + 3 * len(thread_candidates(engine.device)) * len(probes)
            assert len(events[first_start + 1:]) == len(res.rounds)  # then one verification per round
            engine.generate(ids, MethodSpec("all-small"), pair_drafting, gen)
            assert events[first_start + 1 + len(res.rounds)] == ("start", None)  # calibrated once: no new probe
    finally:
        engine.target.verify, engine.start = verify, start
    with cost_curve(engine, {}):
        one = engine.generate(ids[-1:], MethodSpec("all-small"), pair_drafting, gen)  # nothing to calibrate on
        assert not engine.pruner.verify_cost and len(one.new_tokens) == 6


def test_a_step_expands_only_what_the_prune_could_keep():
    """expandable: the pool nodes the prune to B_ver would keep now; their children can make the cut, no other's can."""
    from treegraft.prune import expandable, keepable, prune

    tree = DraftTree.new(0, capacity=8)
    a, _ = add_child(tree, 0, 1, math.log(0.9), SMALL, 1)
    b, _ = add_child(tree, 0, 2, math.log(0.3), SMALL, 1)
    c, _ = add_child(tree, 0, 3, math.log(0.05), SMALL, 1)
    a1, _ = add_child(tree, a, 4, math.log(0.8), SMALL, 2)  # s = 0.72 > s(b)
    pool = np.array([a, b, c, a1])

    def expand(budget, nodes=pool):
        tree.keep_budget = budget
        return expandable(tree, nodes).tolist()

    assert expand(2) == [a, a1]
    assert expand(3) == [a, b, a1]
    assert expand(None) == pool.tolist()  # expand = "all": the paper's pool
    assert expand(1, np.array([0, c])) == [0]  # the root is always keepable
    assert keepable(tree, 2).tolist() == [True, True, False, False, True]
    assert prune(tree, 2).tolist() == [a, a1] and tree.kept[: tree.n].tolist() == keepable(tree, 2).tolist()


def test_mid_calls_score_only_keepable_nodes_and_stay_exact(engine, pair_drafting):
    """On a host whose curve allows B_ver = 3, an all-mid step scores at most the 3 keepable nodes and the root;
    with expand = "all" it scores the whole pool. Both generate exactly plain greedy's tokens."""
    ids, gen = engine.encode("List three uses of a paperclip."), GenerationConfig(max_new_tokens=12)
    ar = engine.generate(ids, MethodSpec("ar"), pair_drafting, gen)
    pools = {}
    for expand in ("keepable", "all"):
        drafting = pair_drafting.model_copy(update={"expand": expand})
        with cost_curve(engine, {0: 50.0, 1: 52.0, 3: 60.0, 7: 200.0, 15: 400.0, 31: 800.0, 63: 1600.0},
                        pinned=True):
            res = engine.generate(ids, MethodSpec("all-mid"), drafting, gen)
            assert engine.pruner.host_budget(drafting.budget, drafting.verify_cost_cap) == 3
        assert res.new_tokens == ar.new_tokens
        pools[expand] = [len(st.pool) for r in res.rounds for st in r.steps]
    assert max(pools["keepable"]) <= 4
    assert max(pools["all"]) > 4


def test_the_cut_among_ngram_nodes_ignores_the_mids_scores_and_prices_them_as_select_would():
    """`cut_among`: what an all-small round's cut would verify of the n-gram nodes (the yield gate's
    counterfactual): the mid's column does not count, and the same choose() prices them."""
    pruner = Pruner()
    pruner.verify_cost.ms = {0: 50.0, 1: 55.0, 3: 65.0, 7: 85.0}  # 5 ms a node: a node pays from pi 0.1
    tree = chain_tree([0.9, 0.3, 0.3])  # pi 0.9, 0.27, 0.08
    add_child(tree, 2, 102, math.log(0.99), MID, 1)  # the mid confirms node 3 (token 102 under node 2) confidently
    nodes = np.array([1, 2, 3])
    cut = pruner.cut_among(tree, nodes, 63, adaptive=True)
    order, _ = choose(np.array([0.9, 0.27, 0.081]), pruner.verify_cost)
    assert cut.tolist() == sorted(nodes[order].tolist()) == [1, 2]  # node 3 is cut on its n-gram score alone
    assert pruner.cut_among(tree, nodes[:1], 63, adaptive=True).tolist() == [1]  # only the nodes given
    assert pruner.cut_among(tree, nodes, 2, adaptive=False).tolist() == [1, 2]  # no cost model: the prune to B_ver
