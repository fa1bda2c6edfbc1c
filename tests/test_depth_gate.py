"""The depth gate (treegraft/scheduler/depth.py): what a step is credited with and charged, the depth it picks, its
exploration, and gated generations on real rounds (fewer steps where deep ones yield nothing, the output unchanged)."""
import numpy as np
import pytest

from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec
from treegraft.scheduler.depth import EXPLORE, MIN_ROUNDS, DepthGate
from treegraft.tree import SMALL, DraftTree, add_child

L = np.log


def flat_cost(n: np.ndarray) -> np.ndarray:
    """T(n) = 20 ms + 1 ms a node."""
    return 20.0 + np.asarray(n, dtype=float)


def chain(steps: list[int]) -> tuple[DraftTree, list[int]]:
    """root -> one node per entry of `steps`, each added at that draft step; returns the tree and its nodes."""
    t = DraftTree.new(100, 16)
    nodes, parent = [], 0
    for i, k in enumerate(steps):
        parent, _ = add_child(t, parent, 1 + i, L(.5), SMALL, k)
        nodes.append(parent)
    return t, nodes


def test_a_step_is_credited_with_its_accepted_nodes_and_charged_its_ms_and_verification():
    g = DepthGate(3)
    t, (a, b, c, d) = chain([1, 1, 2, 3])
    g.of().observe(t, np.array([a, b, c, d]), [0, a, b, c], [1.0, 2.0, 4.0], round_ms=40.0, verify_ms=flat_cost)
    e = g.of().expected()
    assert e["tokens"] == {1: 2.0, 2: 1.0, 3: 0.0}  # a, b from step 1, c from step 2; d (step 3) was not accepted
    assert e["ms"] == {1: 3.0, 2: 3.0, 3: 5.0}  # draft ms + T(4) - T(4 - its kept nodes): 1 + 2, 2 + 1, 4 + 1
    assert e["base_ms"] == pytest.approx(40.0 - 11.0)


def test_the_gate_picks_the_depth_with_the_most_tokens_per_ms():
    g = DepthGate(5)
    t, nodes = chain([1, 2, 3, 4, 5])
    for _ in range(MIN_ROUNDS):  # every round accepts steps 1-2's nodes only; each step costs 1 ms
        g.of().observe(t, np.array(nodes), [0] + nodes[:2], [1.0] * 5, round_ms=30.0, verify_ms=lambda n: 0 * n)
    assert g.of().best() == 2  # (1 + 2) / (25 + 2) beats (1 + 2) / (25 + 3) and (1 + 1) / (25 + 1)
    deep = DepthGate(5)
    for _ in range(MIN_ROUNDS):  # the whole chain accepted: every step pays for its 1 ms
        deep.of().observe(t, np.array(nodes), [0] + nodes, [1.0] * 5, round_ms=30.0, verify_ms=lambda n: 0 * n)
    assert deep.of().best() == 5
    dear = DepthGate(5)
    for _ in range(MIN_ROUNDS):  # the same tokens, but step 3 costs 20 ms: its token does not pay for it
        dear.of().observe(t, np.array(nodes), [0] + nodes[:3], [1.0, 1.0, 20.0, 1.0, 1.0], round_ms=48.0,
                          verify_ms=lambda n: 0 * n)
    assert dear.of().best() == 2


def test_rounds_are_measured_apart_by_who_took_step_one():
    """After a head call at step 1 the n-gram drafter's nodes come at step 2; without it, at step 1."""
    g = DepthGate(3)
    t, nodes = chain([1, 2, 3])
    for _ in range(MIN_ROUNDS):
        g.of("mid").observe(t, np.array(nodes), [0] + nodes[:2], [2.0, 0.5, 0.5], round_ms=30.0,
                            verify_ms=lambda n: 0 * n)  # step 2's node accepted
        g.of("small").observe(t, np.array(nodes), [0] + nodes[:1], [0.5, 0.5, 0.5], round_ms=30.0,
                              verify_ms=lambda n: 0 * n)  # only step 1's
    assert g.of("mid").best() == 2 and g.of("small").best() == 1


def test_a_round_after_a_head_call_takes_the_n_gram_drafters_first_step_too():
    """Where only the head's nodes are ever accepted, a head-first round still takes step 2 (the n-gram drafter's
    first), so the call adds to the n-gram drafter's tree instead of replacing it; a small-first round takes 1."""
    g = DepthGate(4)
    t, nodes = chain([1, 2, 3, 4])
    for _ in range(MIN_ROUNDS + EXPLORE):
        for first in ("mid", "small"):
            d = g.of(first).steps()
            g.of(first).observe(t, np.array(nodes[:d]), [0] + nodes[:1], [1.0] * d, round_ms=30.0,
                                verify_ms=flat_cost)
    assert g.of("mid").best() == 2 and g.of("small").best() == 1
    one = DepthGate(1)  # D = 1: the floor is D
    t1, (a,) = chain([1])
    for _ in range(MIN_ROUNDS + EXPLORE):
        assert one.of("mid").steps() == 1
        one.of("mid").observe(t1, np.array([a]), [0], [1.0], round_ms=30.0, verify_ms=flat_cost)
    assert one.of("mid").best() == 1


def test_a_round_whose_first_steps_are_the_heads_takes_the_n_gram_drafters_first_step_after_them():
    """With `mid_lead` = 2 a call round's steps 1-2 are the head's: it takes at least 3 steps, so the n-gram drafter
    always drafts in it; small-first rounds keep their floor of 1."""
    g = DepthGate(5, mid_lead=2)
    t, nodes = chain([1, 2, 3, 4, 5])
    for _ in range(MIN_ROUNDS + 2 * EXPLORE):
        for first in ("mid", "small"):
            d = g.of(first).steps()
            assert d >= (3 if first == "mid" else 1)
            g.of(first).observe(t, np.array(nodes[:d]), [0] + nodes[:1], [1.0] * d, round_ms=30.0,
                                verify_ms=flat_cost)  # only step 1's node is ever accepted
    assert g.of("mid").best() == 3 and g.of("small").best() == 1


def test_all_steps_first_then_the_best_depth_with_every_explore_th_round_one_step_deeper():
    g = DepthGate(5)
    t, nodes = chain([1, 2, 3, 4, 5])
    taken = []
    for _ in range(MIN_ROUNDS + 3 * EXPLORE):
        d = g.of().steps()
        taken.append(d)
        g.of().observe(t, np.array(nodes[:d]), [0] + nodes[:1], [1.0] * d, round_ms=30.0, verify_ms=flat_cost)
    assert taken[:MIN_ROUNDS] == [5] * MIN_ROUNDS
    later = taken[MIN_ROUNDS:]  # only step 1's node is ever accepted: one step, and two in the explorations
    assert [i for i, d in enumerate(later) if d == 2] == [EXPLORE - 1, 2 * EXPLORE - 1, 3 * EXPLORE - 1]
    assert all(d == 1 for d in later if d != 2)


def test_a_deep_step_that_starts_to_pay_is_found_by_the_exploration():
    g = DepthGate(4)
    t, nodes = chain([1, 2, 3, 4])
    taken = []
    for r in range(MIN_ROUNDS + 5 * EXPLORE):
        d = g.of().steps()
        taken.append(d)
        accepted = nodes[:1] if r < MIN_ROUNDS + EXPLORE else nodes[:d]  # later every step's node is accepted
        g.of().observe(t, np.array(nodes[:d]), [0] + accepted, [1.0] * d, round_ms=30.0, verify_ms=flat_cost)
    assert taken[MIN_ROUNDS] == 1 and taken[-1] == 4  # one step deeper per exploration


def test_gated_generations_take_fewer_steps_and_keep_the_output(engine):
    """On the default pair (fp32): all-small and treegraft with the gate match plain greedy decoding, and a summary
    and a chat take all D steps in their first rounds, fewer in some later ones, never more than D."""
    from treegraft.prompts import load_prompts

    base = engine.pair.config.drafting.model_copy(update={"depth_gate": "yield", "depth": 5})
    gen = GenerationConfig(max_new_tokens=40)
    shallower = 0
    for prompt in [p for p in load_prompts("default") if p.id in ("chat-01", "sum-01")]:
        ids = engine.encode(prompt.messages)
        ar = engine.generate(ids, MethodSpec("ar"), base, gen)
        for method in ("all-small", "treegraft"):
            res = engine.generate(ids, MethodSpec(method), base, gen)
            assert res.new_tokens == ar.new_tokens, f"{method} on {prompt.id}"
            depths = [len(r.steps) for r in res.rounds]
            assert depths[:MIN_ROUNDS] == [5] * min(MIN_ROUNDS, len(depths)) and max(depths) == 5
            assert min(depths) >= 1
            shallower += sum(d < 5 for d in depths)
    assert shallower > 0  # steps 4-5 add (next to) nothing on these prompts: the gate stops before them somewhere


def test_the_gate_is_off_unless_asked_and_trial_rounds_take_every_step(tiny_head_engine):
    engine = tiny_head_engine
    ids = engine.encode(("t3 t5 t7 t3 t5 t9 t2",))
    gen = GenerationConfig(max_new_tokens=16)
    off = engine.generate(ids, MethodSpec("all-small"), DraftingConfig(depth=3, width=3, top_k=2, budget=8), gen)
    assert all(len(r.steps) == 3 for r in off.rounds)
    s = engine.start(ids, MethodSpec("all-small"), DraftingConfig(depth=3, width=3, top_k=2, budget=8,
                                                                    depth_gate="yield"), gen)
    assert isinstance(s.depth_gate, DepthGate)
    means = s.depth_gate.of("small")
    means.rounds, means.best = 99, lambda: 1  # a gate that would take one step
    from treegraft.methods import AllSmall

    assert len(engine.trial_round(s, AllSmall()).steps) == 3


def test_the_gate_is_switched_per_method_and_per_generation():
    from treegraft.bench import parse_methods
    from treegraft.cli import build_parser
    from treegraft.config import ConfigError, load_pair
    from treegraft.generate_cli import settings_from_args

    pair = load_pair("default")
    methods = parse_methods("all-small:dg=yield,all-small:dg=off", pair.drafting)
    gates = {m.label: m.drafting.depth_gate for m in methods}
    assert gates["all-small:dg=yield"] == "yield" and gates["all-small:dg=off"] == "off"
    with pytest.raises(ConfigError, match="depth_gate"):
        parse_methods("all-small:dg=sometimes", pair.drafting)
    for flag, want in ((["--depth-gate", "off"], "off"), (["--depth-gate", "yield"], "yield")):
        args = build_parser().parse_args(["generate", "--prompt", "x", *flag])
        assert settings_from_args(pair, args)[0].depth_gate == want
    assert pair.drafting.mid_lead == 2  # the default pair's call rounds: the head's first two steps
    lead = settings_from_args(pair, build_parser().parse_args(["generate", "--prompt", "x", "--mid-lead", "1"]))[0]
    assert lead.mid_lead == 1
    with pytest.raises(ConfigError, match="mid_lead"):
        settings_from_args(pair, build_parser().parse_args(["generate", "--prompt", "x", "--mid-lead", "0"]))
