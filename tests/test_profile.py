"""The overhead profile: every round's time split into model forwards and bookkeeping parts."""
import pytest

from treegraft.bench import overhead, round_profile
from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import MethodSpec
from treegraft.profile import BOOKKEEPING_PARTS, FORWARD_PARTS, Profile, profiled

DRAFTING = load_pair("default").drafting


@pytest.mark.parametrize("method", ["all-mid", "fixed", "ar"])
def test_rounds_carry_a_profile_that_adds_up_to_their_time(engine, method):
    res = engine.generate(engine.encode("List three fruits."), MethodSpec(method), DRAFTING,
                          GenerationConfig(max_new_tokens=8))
    for r in res.rounds:
        parts = r.profile_ms
        assert set(parts) <= set(FORWARD_PARTS + BOOKKEEPING_PARTS), parts
        assert parts["target_forward"] > 0 and parts["other"] >= 0
        assert sum(parts.values()) == pytest.approx(1000 * r.wall_s, rel=1e-6, abs=0.05)
        if method == "all-mid":
            assert parts["mid_forward"] > 0 and parts["tree"] > 0 and parts["mask"] > 0
        book = sum(v for k, v in parts.items() if k in BOOKKEEPING_PARTS)
        assert 0 < book < sum(parts.values())
    row = {"rounds": len(res.rounds), "profile_ms": round_profile(res.rounds)}
    summary = overhead([row])
    assert set(summary["profile_ms_per_round"]) == set(FORWARD_PARTS + BOOKKEEPING_PARTS)
    assert 0 < summary["overhead_share"] < 1


def test_parts_accumulate_and_take_resets():
    import torch

    p = Profile(torch.device("cpu"))
    with p.part("tree"):
        pass
    with p.part("tree"):
        pass
    out = p.take(wall_s=0.010)
    assert set(out) == {"tree", "other"} and out["tree"] >= 0 and out["tree"] + out["other"] == pytest.approx(10)
    assert p.take(0.0) == {"other": 0.0}


def test_nested_parts_count_exclusive_time_and_decorators_need_an_active_profile(monkeypatch):
    """With a manual clock (no timing): outer spends 1 ms itself around an inner part of 2 ms."""
    import torch

    import treegraft.profile as profile_mod

    now = [0.0]
    monkeypatch.setattr(profile_mod, "timed", lambda device: now[0])

    @profiled("ngram")
    def inner():
        now[0] += 0.002

    @profiled("tree")
    def outer():
        inner()
        now[0] += 0.001

    outer()  # no active profile: runs, records nothing
    p = Profile(torch.device("cpu"))
    assert p.ms == {}
    with p.active():
        outer()
    assert p.ms == pytest.approx({"ngram": 2.0, "tree": 1.0})
