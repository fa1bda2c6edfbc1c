"""The learned scheduler: features, collection, value model + margin distillation, shipped file, policy."""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from treegraft.config import DraftingConfig, GenerationConfig, load_pair, resolve_path
from treegraft.methods import MethodSpec, make_policy
from treegraft.methods import Fixed, StepState
from treegraft.prompts import Prompt
from treegraft.scheduler.features import PAPER_SIX, TREE_CANDIDATES, FeatureTracker, context_names
from treegraft.scheduler.policy import LearnedPolicy, SchedulerFile
from treegraft.scheduler.train import collect, read_dataset, train
from treegraft.tree import MID, SMALL, DraftTree, add_child

L = math.log


def hand_tree():
    """root -> a(.6) -> c(.4) ; root -> b(.3) ; c is the only node of N_k; mid visited root and a."""
    t = DraftTree.new(100, 64)
    a, _ = add_child(t, 0, 1, L(.6), MID, 1)
    b, _ = add_child(t, 0, 2, L(.3), MID, 1)
    c, _ = add_child(t, a, 3, L(.4), SMALL, 2)
    t.mid_visited[[0]] = True
    t.last_added = [c]
    return t, (a, b, c)


def test_tree_features_on_a_hand_built_tree():
    t, (a, b, c) = hand_tree()
    st = StepState(k=3, depth=5, tree=t, actions=[MID, SMALL], prompt_len=10, t_target_ms=50, t_mid_ms=10)
    tracker = FeatureTracker(width=2, top_k=4)
    f, ctx = tracker.all_features(st)
    assert set(f) == set(TREE_CANDIDATES) and len(TREE_CANDIDATES) >= 10
    assert f["frontier_depth"] == pytest.approx(2 / 5)
    assert f["leaf_ratio"] == pytest.approx(2 / 4)  # b, c
    # would-be mid pool = {a, b, c}; top-2 by score: a (.6), b (.3) beat c (.24); both shallower than c
    assert f["past_reselect_ratio"] == pytest.approx(1.0)
    assert f["reselect_overlap"] == 0.0
    assert f["reselect_score"] == pytest.approx((L(.6) + L(.3)) / 2)
    assert f["pool_ratio"] == pytest.approx(L(3 / 1))
    assert f["best_score"] == pytest.approx(L(.24))
    assert f["small_share"] == pytest.approx(1 / 4)
    assert len(ctx) == len(context_names(5)) == 12
    assert ctx[3] == pytest.approx(L(5)) and ctx[4] == pytest.approx(3 / 5) and ctx[6:11] == [1, 0, 0, 0, 0]
    assert ctx[11] == 0.0  # verify_growth: nothing measured in this state
    assert len(PAPER_SIX) + len(ctx) == 18  # the paper's 17 + how fast verification cost grows here


def synthetic_records(n_prompts=10, rounds=4, depth=3, seed=0):
    """A known world: calling the mid at step 1 pays (A += 2) iff the collapse debt is high."""
    rng = np.random.default_rng(seed)
    out = []
    n_ctx = len(context_names(depth))
    for p in range(n_prompts):
        for r in range(rounds):
            hard = rng.random() < 0.5
            trajs = []
            for tau in itertools.product([0, 1], repeat=depth):
                feats = []
                for k in range(1, depth + 1):
                    tree = rng.normal(size=len(TREE_CANDIDATES)) * 0.1
                    tree[TREE_CANDIDATES.index("collapse_debt")] = 3.0 if hard else 0.1
                    ctx = [0.0] * n_ctx
                    ctx[4] = k / depth
                    feats.append(tree.tolist() + ctx)
                A = 1.0 + (2.0 if hard and tau[0] else 0.0) + 0.2 * sum(tau[1:])
                t = 0.100 + 0.050 * sum(tau)
                trajs.append({"schedule": list(tau), "A": A, "t_draft": t - 0.08, "t_verify": 0.08,
                              "features": feats})
            out.append({"prompt_id": f"p{p}", "round": r, "prompt_len": 10, "trajectories": trajs})
    return out


def test_value_model_and_margin_reproduce_a_known_sign():
    records = synthetic_records()
    sched = train(records, depth=3, select=False, log=lambda *_: None)
    idx = [TREE_CANDIDATES.index(n) for n in sched.tree_features]
    ctx = [0.0] * len(context_names(3))
    ctx[4] = 1 / 3
    for debt, want in ((3.0, True), (0.1, False)):
        tree = np.zeros(len(TREE_CANDIDATES))
        tree[TREE_CANDIDATES.index("collapse_debt")] = debt
        z = np.array([tree[i] for i in idx] + ctx, np.float32)
        assert (sched.g(z[None])[0, 0] > 0) == want, debt


def test_feature_selection_stops_when_held_out_error_stops_improving():
    lines = []
    candidates = ["leaf_ratio", "collapse_debt", "tree_fill", "small_share"]
    sched = train(synthetic_records(n_prompts=6, rounds=2), depth=3, select=True, log=lines.append, n_keep=4,
                  candidates=candidates)
    assert sched.tree_features == ["collapse_debt"]  # the one signal that matters, and nothing else
    table = sched.meta["cv_table"]
    assert len(table) == 3 and table[1][1] < 0.9 * table[0][1]  # context only, + debt, + the rejected next one
    assert table[2][1] > 0.99 * table[1][1] and any("stop" in ln for ln in lines)
    assert 0 <= sched.meta["sign_agreement_heldout"] <= 1 and 0 < sched.meta["share_mid_pays"] < 1


def test_collect_one_round_gives_all_schedules_with_consistent_A(tiny_engine, tmp_path):
    drafting = DraftingConfig(depth=3, width=3, top_k=2, budget=8)
    out = tmp_path / "data.jsonl"
    prompt = Prompt("p0", "test", ("t3 t5 t7 t3 t5 t7 t3",))
    n = collect(tiny_engine, [prompt], out, drafting, rounds_per_prompt=1, max_new_tokens=16)
    recs = read_dataset(out)
    assert n == 1 and len(recs) == 1
    trajs = recs[0]["trajectories"]
    assert sorted(tuple(t["schedule"]) for t in trajs) == list(itertools.product([0, 1], repeat=3))
    for t in trajs:
        assert 0 <= t["A"] <= 3 and len(t["features"]) == 3
        assert len(t["features"][0]) == len(TREE_CANDIDATES) + len(context_names(3))
    # replaying one schedule for real from the same state gives the recorded A
    ids = tiny_engine.encode(prompt.messages)
    gen = GenerationConfig(max_new_tokens=16)
    s = tiny_engine.start(ids, MethodSpec("fixed"), drafting.model_copy(update={"schedule": (1, 0, 1)}), gen)
    tiny_engine.speculative_round(s)
    for tau in [(0, 0, 0), (1, 1, 1), (1, 0, 1)]:
        v = tiny_engine.trial_round(s, Fixed(tau))
        rec = next(t for t in trajs if tuple(t["schedule"]) == tau)
        assert v.acc.accepted_tokens == rec["A"], tau
        assert rec["verified"] == len(v.kept) and len(rec["step_s"]) == 3


def test_resume_skips_prompts_already_collected(tiny_engine, tmp_path):
    drafting = DraftingConfig(depth=2, width=2, top_k=2, budget=4)
    out = tmp_path / "data.jsonl"
    p = Prompt("p0", "test", ("t1 t2 t1 t2",))
    assert collect(tiny_engine, [p], out, drafting, rounds_per_prompt=1, max_new_tokens=8) == 1
    assert collect(tiny_engine, [p], out, drafting, rounds_per_prompt=1, max_new_tokens=8) == 0


def test_shipped_scheduler_for_the_default_pair():
    pair = load_pair("default")
    path = resolve_path(pair.scheduler)
    sched = SchedulerFile.load(path)
    n_in = len(sched.tree_features) + len(sched.context_features)
    assert sched.context_features == context_names(pair.drafting.depth)  # verify_growth included
    assert sched.g.n_params == n_in * 64 + 64 + 64 * 32 + 32 + 33 and 2_000 < sched.g.n_params < 4_000  # ~3K
    assert sched.depth == pair.drafting.depth and 1 <= len(sched.tree_features) <= 6
    table = sched.meta["cv_table"]  # forward selection stopped where held-out error stopped improving
    assert len(table) == len(sched.tree_features) + 2 or len(sched.tree_features) == 6
    assert 0 < sched.meta["sign_agreement_heldout"] <= 1 and 0 < sched.meta["share_mid_pays"] < 1
    assert len(sched.meta["cost_profiles"]) > 1  # trained on re-timed hosts: it transfers
    assert sched.meta["hardware"] and sched.meta["timings"]["t_target_ms"] > 0
    learned = pair.drafting.model_copy(update={"mid_gate": "off"})  # the pair's own treegraft gates step 1
    policy = make_policy(MethodSpec("treegraft"), learned, pair.scheduler)
    assert isinstance(policy, LearnedPolicy) and policy.note is None


def test_missing_scheduler_falls_back_and_says_so():
    policy = make_policy(MethodSpec("treegraft"), DraftingConfig(), "models/none/scheduler.json")
    assert isinstance(policy, Fixed) and "falls back to the fixed schedule" in policy.note


def test_mid_budget_b0_caps_calls_per_round():
    pair = load_pair("default")
    policy = make_policy(MethodSpec("treegraft"), pair.drafting.model_copy(update={"mid_gate": "off"}),
                         pair.scheduler, b0=1)
    t, _ = hand_tree()
    st = StepState(k=3, depth=5, tree=t, actions=[MID, SMALL], prompt_len=10, t_target_ms=50, t_mid_ms=10)
    policy.sched.threshold = -1e6  # force a positive margin (g_psi(z) - tau)
    d = policy.decide(st)
    assert d.margin > 0 and d.action == SMALL  # the one allowed call was spent at step 1


def test_decision_threshold_removes_false_positives_and_keeps_true_ones():
    from treegraft.scheduler.value import decision_threshold

    never_pays = decision_threshold(np.array([0.5, -0.2, 0.1]), np.array([-1.0, -1.0, -1.0]))
    assert never_pays >= 0.5  # no state is called
    tau = decision_threshold(np.array([1.0, 0.8, 0.1, -0.5]), np.array([1.0, 1.0, -0.5, -1.0]))
    assert tau == pytest.approx(0.1)  # calls exactly the two states that pay


def test_scheduler_inputs_are_clipped_to_the_training_range():
    from treegraft.scheduler.policy import NumpyMLP

    rng = np.random.default_rng(0)
    net = NumpyMLP([(rng.normal(size=(4, 2)).astype(np.float32), np.zeros(4, np.float32)),
                    (rng.normal(size=(1, 4)).astype(np.float32), np.zeros(1, np.float32))],
                   np.zeros(2), np.ones(2), np.zeros(1), np.ones(1))
    net.clip_to(np.array([[0.0, 0.0], [1.0, 2.0]]))
    assert net(np.array([[5.0, -3.0]])) == pytest.approx(net(np.array([[1.0, 0.0]])))
    again = NumpyMLP.from_json(json.loads(json.dumps(net.to_json())))
    assert again(np.array([[5.0, -3.0]])) == pytest.approx(net(np.array([[1.0, 0.0]])))


def test_folded_scheduler_net_computes_the_normalised_mlp():
    """g_psi is evaluated with its input and output normalisations folded into its first and last layers: the same
    function as normalise -> layers -> de-normalise, on inputs inside and outside the training range."""
    from treegraft.scheduler.policy import NumpyMLP

    rng = np.random.default_rng(1)
    layers = [(rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=16).astype(np.float32)),
              (rng.normal(size=(8, 16)).astype(np.float32), rng.normal(size=8).astype(np.float32)),
              (rng.normal(size=(1, 8)).astype(np.float32), rng.normal(size=1).astype(np.float32))]
    mean, std = rng.normal(size=5).astype(np.float32), rng.uniform(0.1, 3, size=5).astype(np.float32)
    net = NumpyMLP(layers, mean, std, np.array([0.3], np.float32), np.array([2.5], np.float32))
    net.clip_to(rng.normal(size=(50, 5)) * 2)
    x = rng.normal(size=(200, 5)).astype(np.float32) * 3
    h = (np.clip(x, net.x_lo, net.x_hi) - mean) / std
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        h = np.maximum(h, 0) if i < len(layers) - 1 else h
    assert net(x) == pytest.approx(h * 2.5 + 0.3, rel=1e-4, abs=1e-4)
    assert net(x[:1]).shape == (1, 1)


def test_features_asked_one_by_one_equal_the_full_set():
    """The online scheduler computes only the signals its file names; each equals the collected full set's."""
    import math
    import random

    from treegraft.methods import StepState
    from treegraft.scheduler.features import TREE_CANDIDATES, tree_features
    from treegraft.tree import MID, SMALL, DraftTree, add_child

    rng = random.Random(0)
    for _ in range(20):
        t = DraftTree.new(5, capacity=300)
        for _ in range(rng.randrange(0, 120)):
            add_child(t, rng.randrange(t.n), rng.randrange(50), math.log(rng.uniform(0.01, 1)),
                      rng.choice([SMALL, MID]), rng.randrange(1, 6))
        t.mid_visited[:rng.randrange(t.n + 1)] = True
        st = StepState(rng.randrange(1, 6), 5, t, [rng.randrange(2) for _ in range(rng.randrange(5))], 100)
        full = tree_features(st, 8, 4, -1.5)
        assert list(full) == list(TREE_CANDIDATES)
        for name in TREE_CANDIDATES:
            assert tree_features(st, 8, 4, -1.5, [name]) == {name: full[name]}


def test_t_mid_is_measured_at_load_before_a_scheduled_method_runs(tiny_engine):
    """The scheduler reads t_mid from its first decision: the engine measures a mid step off the clock before the
    first scheduled generation (not the scheduler file's, another host's), once; other methods do not pay for it."""
    drafting = DraftingConfig(depth=3, width=3, top_k=2, budget=8, schedule=(0, 0, 0))  # no scheduler: this
    ids = tiny_engine.encode(("t3 t5 t7 t3 t5 t7",))                                      # schedule, never the mid
    gen = GenerationConfig(max_new_tokens=6)
    saved = dict(tiny_engine.timing_ms)
    try:
        tiny_engine.timing_ms = {"target": 0.0, "mid": 0.0}
        plain = tiny_engine.generate(ids, MethodSpec("all-small"), drafting, gen)
        assert tiny_engine.timing_ms["mid"] == 0.0
        res = tiny_engine.generate(ids, MethodSpec("treegraft"), drafting, gen)
        assert sum(r.mid_calls for r in res.rounds) == 0 and tiny_engine.timing_ms["mid"] > 0  # no round called it
        assert res.new_tokens == plain.new_tokens
        measured = tiny_engine.timing_ms["mid"]
        tiny_engine.generate(ids, MethodSpec("treegraft"), drafting, gen)
        assert tiny_engine.timing_ms["mid"] == measured  # once per engine
    finally:
        tiny_engine.timing_ms = saved
