"""scripts/gate_replay.py's bounds on step-1 rules, on hand-made trial rounds (no model, no clock)."""
import pytest


@pytest.fixture(scope="module")
def replay(load_script):
    return load_script("gate_replay")


def trial(a_small, ms_small, a_call, ms_call, p1=0.5):
    return dict(a_small=a_small, ms_small=ms_small, a_call=a_call, ms_call=ms_call, p1=p1)


def test_speed_reads_tokens_per_ms_against_all_small(replay):
    rounds = [trial(2, 40.0, 4, 50.0), trial(2, 40.0, 2, 50.0)]
    assert replay.speed(rounds, [False, False]) == pytest.approx(1.0)
    assert replay.speed(rounds, [True, False]) == pytest.approx((4 + 2) / (50 + 40) / (4 / 80))
    assert replay.speed(rounds, [True, True]) == pytest.approx(6 / 100 / (4 / 80))


def test_hindsight_bounds_every_rule_and_a_cheaper_call_pays_more(replay):
    # prompt a: the call pays in its first round only; prompt b: it never pays (the n-gram drafter copies)
    prompts = {"a": [trial(2, 40.0, 4, 44.0, p1=0.9), trial(2, 40.0, 2, 44.0, p1=0.2)],
               "b": [trial(4, 40.0, 4, 45.0, p1=0.95), trial(4, 40.0, 4, 45.0, p1=0.3)]}
    out = replay.bounds(prompts, [1.0, 4.0])
    per_round, share = out["hindsight, per round"]
    assert share == pytest.approx(0.25)  # exactly the one round where the call paid
    assert per_round == pytest.approx((replay.speed(prompts["a"], [True, False]) + 1.0) / 2)
    per_prompt, share_p = out["hindsight, per prompt"]
    assert share_p == pytest.approx(0.5) and per_prompt <= per_round  # a: called throughout; b: never
    thresholds = {k: v for k, v in out.items() if k.startswith("call where p1")}
    assert len(thresholds) == 6 and all(ratio <= per_round + 1e-12 for ratio, _ in thresholds.values())
    one, four = out["always, a call 1 ms cheaper"][0], out["always, a call 4 ms cheaper"][0]
    assert one < four and out["always, a call 4 ms cheaper"][1] == 1.0
    # with the call 4 ms cheaper, prompt a's call rounds cost what all-small's do: a gains 2 tokens in 80 ms
    assert four == pytest.approx((6 / 80 / (4 / 80) + (8 / 82) / (8 / 80)) / 2)


def test_a_signal_a_round_lacks_calls_there_and_each_signal_gets_its_quartile_rules(replay):
    # prev_a: the previous round's path; a prompt's first round has none, so every rule on it calls there
    prompts = {"a": [dict(trial(2, 40.0, 4, 44.0), prev_a=None), dict(trial(2, 40.0, 2, 44.0), prev_a=5)],
               "b": [dict(trial(4, 40.0, 4, 45.0), prev_a=None), dict(trial(4, 40.0, 4, 45.0), prev_a=1)]}
    out = replay.bounds(prompts, [])
    rules = {k: v for k, v in out.items() if k.startswith("call where prev_a")}
    assert len(rules) == 6 and not any(k.startswith("call where ng_") for k in out)  # only signals the rows carry
    for _, share in rules.values():
        assert share >= 0.5  # the two first rounds call under every threshold
    high = out["call where prev_a >= 4.00"]  # the upper quartile of (5, 1): the first rounds and the one after a's
    # long path (it lost there)
    assert high[1] == pytest.approx(0.75)


def test_by_category_bounds_each_category_alone(replay):
    # chat: the call pays in every round; summaries: never (the n-gram drafter copies); one prompt each
    prompts = {"c": [dict(trial(2, 40.0, 4, 44.0), cat="chat"), dict(trial(2, 40.0, 3, 44.0), cat="chat")],
               "s": [dict(trial(4, 40.0, 4, 45.0), cat="summarisation")] * 2}
    out = replay.by_category(prompts, [2.0])
    assert list(out) == ["chat", "summarisation"] and out["chat"][0] == 1
    chat, summ = out["chat"][1], out["summarisation"][1]
    assert chat["always"][0] == pytest.approx(7 / 88 / (4 / 80))  # calling always is chat's hindsight too
    assert chat["always"][0] == pytest.approx(chat["hindsight, per prompt"][0])
    assert summ["always"][0] == pytest.approx(4 / 45 / (4 / 40)) and summ["hindsight, per round"] == (1.0, 0.0)
    assert chat["always, a call 2 ms cheaper"][0] > chat["always"][0]
    # the categories' own bounds, not the pooled ones: pooled, calling always averages a gain and a loss
    pooled = replay.bounds(prompts, [])["hindsight, per prompt"][0]
    assert pooled == pytest.approx((chat["always"][0] + 1.0) / 2)


def test_the_learned_rule_is_fitted_without_the_prompt_it_replays(replay):
    """Held out by prompt: where the signal that marks a paying round is the same in every prompt, the rule finds
    those rounds in the prompt it never saw; where one prompt's signal says the opposite of the others', what they
    taught loses there."""
    def rounds(pays_at_high: bool):
        return [dict(trial(2, 40.0, 5, 44.0) if (p1 > 0.5) == pays_at_high else trial(2, 40.0, 1, 44.0), p1=p1)
                for p1 in (0.0, 1.0, 0.05, 0.95)]

    same = {k: rounds(True) for k in "abc"}
    ratio, share = replay.learned(same, ridge=0.1)
    assert share == pytest.approx(0.5)  # exactly the paying rounds
    assert ratio == pytest.approx(replay.bounds(same, [])["hindsight, per round"][0])
    flipped = {"a": rounds(True), "b": rounds(True), "c": rounds(False)}
    assert replay.learned(flipped, ridge=0.1)[0] < ratio
