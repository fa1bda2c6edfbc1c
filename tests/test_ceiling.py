"""The hindsight ceiling on collected rounds (`scheduler ceiling`): what any scheduler could reach with these
drafters and costs. Checked on the default pair's committed collected rounds against brute force."""
import itertools
import json
from pathlib import Path

import pytest

from treegraft.scheduler.costs import CostProfile
from treegraft.scheduler.replay import ceiling, fixed_decider, hindsight, modelled, replay_round, throughput

DATA = Path(__file__).resolve().parents[1] / "models/smollm2-head/scheduler_data.jsonl"
DEPTH = 5


@pytest.fixture(scope="module")
def rounds():
    with DATA.open() as f:
        recs = [json.loads(next(f)) for _ in range(24)]
    return modelled(recs, CostProfile.of_records(recs))


def rate(picked):
    return sum(t["A"] + 1 for t in picked) / sum(t["t_draft"] + t["t_verify"] for t in picked)


def test_modelled_times_come_from_the_profile(rounds):
    prof = CostProfile.of_records(rounds)
    for r in rounds:
        for t in r["trajectories"]:
            assert t["t_verify"] == pytest.approx(float(prof.T(t["verified"])) / 1000)
            assert t["step_s"] == pytest.approx([(prof.mid_ms if a else prof.small_ms) / 1000 for a in t["schedule"]])


def test_the_per_round_pick_is_the_best_any_choice_of_schedules_gives(rounds):
    """Dinkelbach's pick against brute force over every combination of three rounds' 32 schedules."""
    few = rounds[:3]
    best = max(rate(combo) for combo in itertools.product(*(r["trajectories"] for r in few)))
    assert rate(hindsight(few)) == pytest.approx(best)


def test_the_ceilings_bound_every_fixed_schedule_and_each_other(rounds):
    fixed = [rate([replay_round(r, fixed_decider(s)) for r in rounds])
             for s in itertools.product([0, 1], repeat=DEPTH)]
    per_prompt, per_round = rate(hindsight(rounds, per="prompt")), rate(hindsight(rounds))
    assert max(fixed) <= per_prompt * (1 + 1e-9) and per_prompt <= per_round * (1 + 1e-9)
    # one prompt: the per-prompt ceiling is the best fixed schedule
    one = [r for r in rounds if r["prompt_id"] == rounds[0]["prompt_id"]]
    best_fixed = max(rate([replay_round(r, fixed_decider(s)) for r in one])
                     for s in itertools.product([0, 1], repeat=DEPTH))
    assert rate(hindsight(one, per="prompt")) == pytest.approx(best_fixed)


def test_a_free_mid_call_only_raises_what_the_mid_can_add(rounds):
    out = ceiling(rounds, DEPTH, mid_scales=(1.0, 0.0))["by_scale"]
    paid, free = out["1"]["all"], out["0"]["all"]
    assert free["all-small"]["speedup"] == pytest.approx(paid["all-small"]["speedup"])
    assert free["all-mid"]["speedup"] > paid["all-mid"]["speedup"]
    assert free["ceiling"]["speedup"] >= paid["ceiling"]["speedup"]
    assert paid["ceiling / all-small"] >= 1.0 and paid["prompt ceiling / all-small"] >= 1.0
    assert throughput([replay_round(r, fixed_decider((0,) * DEPTH)) for r in rounds],
                      CostProfile.of_records(rounds))["mid_rate"] == 0.0
