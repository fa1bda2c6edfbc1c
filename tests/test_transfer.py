"""Clean scheduler data and a scheduler that transfers: same-state trials, re-timing under other hosts' costs,
exact policy replay on collected rounds."""
import itertools
import math

import numpy as np
import pytest

from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import Fixed, MethodSpec
from treegraft.prompts import Prompt
from treegraft.prune import EXPLORE_AFTER
from treegraft.scheduler.costs import CostProfile, jittered, retime
from treegraft.scheduler.features import TREE_CANDIDATES, context_names
from treegraft.scheduler.replay import fixed_decider, replay, replay_round
from treegraft.scheduler.train import RecordingPolicy, collect, read_dataset

DEPTH = 3


def fingerprint(engine):
    p = engine.pruner
    return (sorted(p.verify_cost.ms.items()), p.acceptance.hits.tolist(), p.acceptance.trials.tolist(),
            sorted(engine.timing_ms.items()), p.idle, p.host_b, p.row_ms)


def test_two_trials_of_one_schedule_from_one_state_agree(engine):
    """With the default pair's own settings (cost-aware cut on, its B_ver): a trial learns nothing, so the same
    schedule tried twice from one state gives the same A, the same verified nodes and the same inputs."""
    pair = load_pair("default")
    drafting = pair.drafting
    assert drafting.adaptive_budget
    ids = engine.encode("Summarise: the cat sat on the mat. The cat sat on the mat because the mat was warm.")
    s = engine.start(ids, MethodSpec("fixed"), drafting, GenerationConfig(max_new_tokens=32))
    for _ in range(2):
        engine.speculative_round(s)
        s.rounds += 1
    # One round short of exploring: a trial that counted as an idle round would explore (or reset the count),
    # and the next trial of the same schedule would verify another tree.
    engine.pruner.idle = EXPLORE_AFTER - 1
    before = fingerprint(engine)
    timing = (s.t_target_ms, s.t_mid_ms, s.verify_growth, len(s.committed), len(s.ngram.tokens))
    for tau in [(1, 0, 1, 0, 1), (0, 0, 0, 0, 0), (1, 1, 1, 1, 1)]:
        a = engine.trial_round(s, RecordingPolicy(tau, drafting.width, drafting.top_k))
        b = engine.trial_round(s, RecordingPolicy(tau, drafting.width, drafting.top_k))
        assert a.acc.accepted_tokens == b.acc.accepted_tokens and a.acc.path == b.acc.path, tau
        assert a.kept.tolist() == b.kept.tolist(), tau
        assert [st.features for st in a.steps] == [st.features for st in b.steps], tau
    assert fingerprint(engine) == before  # nothing learned: pruner, cost curve, timing means
    assert (s.t_target_ms, s.t_mid_ms, s.verify_growth, len(s.committed), len(s.ngram.tokens)) == timing


def test_engine_state_restores_what_a_generation_taught(engine):
    pair = load_pair("default")
    ids = engine.encode("Name three colours.")
    engine.generate(ids, MethodSpec("all-small"), pair.drafting, GenerationConfig(max_new_tokens=8))
    saved = engine.state()
    before = fingerprint(engine)
    engine.generate(ids, MethodSpec("all-mid"), pair.drafting, GenerationConfig(max_new_tokens=16))
    assert fingerprint(engine) != before  # a generation teaches the pruner and the timing means
    engine.restore(saved)
    assert fingerprint(engine) == before
    engine.generate(ids, MethodSpec("all-mid"), pair.drafting, GenerationConfig(max_new_tokens=16))
    engine.restore(saved)
    assert fingerprint(engine) == before  # the saved state is a copy, not the live pruner


def timed_part(engine):
    """What an engine learned from a clock: T(n) (rounds and probes), the head's H, a row's ms, B_ver, the threads,
    the rounds' rate, the cut's recent choices and the scheduler's timing means."""
    p = engine.pruner
    return (sorted(p.verify_cost.ms.items()), sorted(p.probe_cost.ms.items()), sorted(p.head_cost.ms.items()),
            p.row_ms, p.host_b, p.threads, p.round_tokens, p.round_ms, list(p.chosen), p.idle,
            sorted(engine.timing_ms.items()))


def accepted_part(engine_or_state):
    """What an engine (or a saved state) learned from what the target accepted: the acceptance record."""
    a = engine_or_state.pruner.acceptance
    return a.hits.tolist(), a.trials.tolist()


def test_restore_timings_undoes_the_clock_and_keeps_the_acceptance(engine):
    """The app's drawn run (a browser may render beside it): its timings are put back, what it accepted is kept."""
    pair = load_pair("default")
    ids = engine.encode("Name three colours.")
    engine.generate(ids, MethodSpec("all-small"), pair.drafting, GenerationConfig(max_new_tokens=8))
    saved = engine.state()
    clock = timed_part(engine)
    engine.generate(ids, MethodSpec("treegraft"), pair.drafting, GenerationConfig(max_new_tokens=24))
    taught = accepted_part(engine)
    assert timed_part(engine) != clock and taught != accepted_part(saved)
    engine.restore_timings(saved)
    assert timed_part(engine) == clock and accepted_part(engine) == taught
    engine.generate(ids, MethodSpec("all-small"), pair.drafting, GenerationConfig(max_new_tokens=8))
    assert timed_part(engine) != clock  # it learns from the clock again
    engine.restore_timings(saved)
    assert timed_part(engine) == clock  # the saved state is a copy: later rounds did not change it


def collected(tiny_engine, tmp_path):
    from treegraft.config import DraftingConfig

    drafting = DraftingConfig(depth=DEPTH, width=3, top_k=2, budget=8, adaptive_budget=True)
    out = tmp_path / "data.jsonl"
    prompts = [Prompt(f"p{i}", "test", (f"t{i} t5 t7 t{i} t5 t7 t{i}",)) for i in range(2)]
    collect(tiny_engine, prompts, out, drafting, rounds_per_prompt=2, max_new_tokens=24)
    return read_dataset(out)


def test_collected_rounds_carry_what_re_timing_needs(tiny_engine, tmp_path):
    recs = collected(tiny_engine, tmp_path)
    assert recs and all(r["verify_ms"] for r in recs)
    for r in recs:
        for t in r["trajectories"]:
            assert len(t["step_s"]) == DEPTH and t["t_draft"] >= sum(t["step_s"])  # + scheduler and glue
            assert 0 <= t["verified"] <= 8
            assert len(t["features"][0]) == len(TREE_CANDIDATES) + len(context_names(DEPTH))
    prof = CostProfile.of_records(recs)
    assert 0 in prof.verify_ms and prof.mid_ms > 0 and prof.small_ms > 0


def test_retime_is_identity_under_the_same_costs_and_scales_otherwise(tiny_engine, tmp_path):
    recs = collected(tiny_engine, tmp_path)
    src = CostProfile.of_records(recs)
    same = retime(recs, src, src)
    for a, b in zip(recs, same):
        for ta, tb in zip(a["trajectories"], b["trajectories"]):
            assert tb["t_verify"] == pytest.approx(ta["t_verify"]) and tb["t_draft"] == pytest.approx(ta["t_draft"])
            assert np.allclose(ta["features"], tb["features"])
    slow = src.scaled("slow", target=2.0, mid=3.0)
    other = retime(recs, src, slow)
    names = context_names(DEPTH)
    at = len(TREE_CANDIDATES)
    for a, b in zip(recs, other):
        for ta, tb in zip(a["trajectories"], b["trajectories"]):
            assert tb["A"] == ta["A"] and tb["t_verify"] == pytest.approx(2 * ta["t_verify"])
            mids = sum(t for x, t in zip(ta["schedule"], ta["step_s"]) if x)
            smalls = sum(t for x, t in zip(ta["schedule"], ta["step_s"]) if not x)
            assert tb["t_draft"] == pytest.approx(ta["t_draft"] + 2 * mids)
            fa, fb = ta["features"][0], tb["features"][0]
            assert fb[at + names.index("t_mid_ms")] == pytest.approx(3 * fa[at + names.index("t_mid_ms")])
            assert fb[at + names.index("t_target_ms")] == pytest.approx(2 * fa[at + names.index("t_target_ms")])
            assert fb[at + names.index("verify_growth")] == pytest.approx(fa[at + names.index("verify_growth")])
    # The tiny model's measured curve can be flat (T(8) <= T(0) on a fast moment: growth 0), so the growth
    # checks run on a curve of known shape with the collected records' step costs, not on the timing.
    shaped = CostProfile("shaped", {0: 100.0, 8: 150.0, 63: 400.0}, src.mid_ms, src.small_ms)
    assert shaped.growth == pytest.approx(math.log(1.5))
    steep = shaped.scaled("steep", steepness=2.0)
    assert steep.growth == pytest.approx(2 * shaped.growth) and steep.T(0) == pytest.approx(shaped.T(0))
    f0, f1 = (retime(recs, src, p)[0]["trajectories"][0]["features"][0] for p in (shaped, steep))
    assert f1[at + names.index("verify_growth")] == pytest.approx(f0[at + names.index("verify_growth")]
                                                                  + shaped.growth)
    hosts = jittered(shaped, 5, seed=1)
    assert len({round(h.growth, 6) for h in hosts}) == 5
    assert all(0.5 * shaped.growth <= h.growth <= 2.5 * shaped.growth for h in hosts)


def test_replay_follows_the_policy_through_recorded_prefixes():
    depth = 3
    trajs = []
    for tau in itertools.product([0, 1], repeat=depth):
        feats = [[float(k), float(sum(tau[: k - 1]))] for k in range(1, depth + 1)]  # state = (k, mids so far)
        trajs.append({"schedule": list(tau), "A": sum(tau), "t_draft": 0.01 * (1 + sum(tau)), "t_verify": 0.1,
                      "features": feats})
    rec = {"prompt_id": "p", "round": 0, "trajectories": trajs}
    # a policy that calls the mid only while fewer than one call was made: (1, 0, 0)
    picked = replay_round(rec, lambda f, k: int(f[1] < 1))
    assert picked["schedule"] == [1, 0, 0]
    prof = CostProfile("p", {0: 100.0, 8: 150.0}, 10.0, 1.0)
    r = replay([rec], fixed_decider((1, 1, 1)), prof)
    assert r["mid_rate"] == 1.0 and r["speedup"] == pytest.approx((3 + 1) / (0.04 + 0.1) * 100 / 1000)


def test_span_proposals_copy_long_matches():
    from treegraft.drafters.ngram import SPAN_MIN_MATCH, NgramIndex

    idx = NgramIndex(5)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    idx.extend(text + [50, 51, 1, 2, 3])  # the context repeats 1 2 3: what followed is likely copied again
    chain = idx.span([], 10)
    assert [t for t, _ in chain] == [4, 5, 6, 7, 8, 9, 10, 11, 50, 51]  # up to span_max, p = 1 all along
    assert all(p == 1.0 for _, p in chain)
    assert [t for t, _ in idx.span([], 3)] == [4, 5, 6]
    # a short match (below SPAN_MIN_MATCH tokens) gives no span
    short = NgramIndex(5)
    short.extend([1, 2, 7, 9, 1, 2])
    assert SPAN_MIN_MATCH > 2 and short.span([], 10) == []
    # an ambiguous continuation (p < SPAN_MIN_P) stops the chain
    amb = NgramIndex(5)
    amb.extend([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3])
    assert amb.span([], 10) == []
    # incremental: tokens appended later extend what a span can copy, with no rescan
    idx.extend([4, 5])
    assert [t for t, _ in idx.span([], 4)] == [6, 7, 8, 9]


def test_span_cost_does_not_grow_with_the_context():
    """Counted look-ups (no clock): one span of L tokens reads at most n_max tables per chain token."""
    from treegraft.drafters.ngram import NgramIndex

    for n_ctx in (200, 20_000):
        idx = NgramIndex(5)
        base = list(range(100, 140))
        filler = [int(x) for x in np.random.default_rng(0).integers(1000, 5000, n_ctx)]
        idx.extend(base + filler + base[:6])
        reads = 0
        tables = idx.tables

        class Counting(dict):
            def get(self, key, default=None):
                nonlocal reads
                reads += 1
                return dict.get(self, key, default)

        idx.tables = [Counting(t) for t in tables]
        chain = idx.span([], 10)
        assert len(chain) == 10
        assert reads <= 10 * 5 + 5, (n_ctx, reads)


def test_small_step_grafts_a_span_under_its_best_child(tiny_engine):
    from treegraft.drafters.ngram import SmallDrafter
    from treegraft.config import DraftingConfig

    drafting = DraftingConfig(depth=2, width=2, top_k=2, budget=63, span_max=4)
    ids = tiny_engine.encode("t1 t2 t3 t4 t5 t6 t7 t8 t1 t2 t3")
    s = tiny_engine.start(ids, MethodSpec("all-small"), drafting, GenerationConfig(max_new_tokens=8))
    tree = tiny_engine.new_tree(s)
    step = SmallDrafter().step(s, tree, 1)
    depths = tree.depth[: tree.n]
    assert depths.max() >= 3 and len(step.added) >= 3  # a chain deeper than one step's single token
    assert (tree.step[1: tree.n] == 1).all()  # all of it in this one small step
