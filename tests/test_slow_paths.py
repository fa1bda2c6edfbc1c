"""The slow parts (marked slow: `make test-slow`, and CI after `make test`): the bf16 pass and a calibration
on a busy host. (The full 13-prompt greedy sweep is in test_greedy_exact.py, the soak in test_concurrency.py.)"""
import json
from pathlib import Path

import pytest
import torch

from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import MethodSpec
from treegraft.prompts import load_prompts

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
METHODS = ("all-small", "all-mid", "fixed", "treegraft")


@pytest.mark.slow
def test_bf16_pass_runs_every_method_and_reports_its_match_rate():
    """In bf16 a batched forward (a tree, or Hugging Face's one-pass prefill) and a one-token forward round
    differently, so outputs may differ from the engine's AR (measured here: Hugging Face's greedy decoding and
    the engine's AR can differ from the first token, a near-tie after the prefill): every method still runs to
    its length, and each one's leading-token match with AR, and HF generate's, is written to
    artifacts/bf16_match.json and printed."""
    from treegraft.engine import Engine
    from treegraft.models import load_pair_models

    pair = load_pair("default")
    engine = Engine(load_pair_models(pair, "bfloat16"))
    assert engine.dtype_name == "bfloat16"
    gen = GenerationConfig(max_new_tokens=24)
    rates = {m: [] for m in ("hf-generate",) + METHODS}
    for prompt in [p for p in load_prompts("default") if p.id in ("chat-01", "code-02")]:
        ids = engine.encode(prompt.messages)
        ar = engine.generate(ids, MethodSpec("ar"), pair.drafting, gen)
        x = torch.tensor([ids])
        hf = engine.pair.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=gen.max_new_tokens,
                                         do_sample=False, pad_token_id=engine.tokenizer.eos_token_id)
        outputs = {"hf-generate": engine.trim(hf[0, len(ids):].tolist(), gen.max_new_tokens)}
        for m in METHODS:
            res = engine.generate(ids, MethodSpec(m), pair.drafting, gen)
            assert res.dtype == "bfloat16" and (len(res.new_tokens) == len(ar.new_tokens) or res.stopped == "eos")
            outputs[m] = res.new_tokens
        for m, new in outputs.items():
            lead = next((i for i, (a, b) in enumerate(zip(ar.new_tokens, new)) if a != b),
                        min(len(ar.new_tokens), len(new)))
            rates[m].append(lead / len(ar.new_tokens))
    assert all(0 <= r <= 1 for v in rates.values() for r in v) and all(len(v) == 2 for v in rates.values())
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "bf16_match.json").write_text(json.dumps(rates, indent=1))
    print("bf16 leading-token match with AR:", {m: [round(r, 2) for r in v] for m, v in rates.items()})


@pytest.mark.slow
def test_calibration_on_a_busy_host_runs_and_reports_its_b_ver(engine):
    """One CPU-bound process beside a real calibration (the 2 cores shared). What a busy host does to the timings
    is measured, never asserted (no assertion here depends on timing; the scripted-clock tests in
    test_cost_model.py pin the arithmetic, and `bench --background-load 1` reports B_ver on a busy host): the
    calibration completes, keeps one of its candidate thread counts, yields a non-decreasing curve over every
    probe size and a B_ver among the probe buckets; quiet and busy B_ver are printed."""
    from treegraft.engine import thread_candidates
    from treegraft.load import background_load
    from treegraft.prune import Pruner, probe_sizes

    d = load_pair("default").drafting
    ids = engine.encode("Summarise the plot of a famous novel in three sentences.")
    before = torch.get_num_threads()

    def calibrated():
        p = Pruner()
        p.calibrate(engine.target, ids, d.budget, d.verify_cost_cap, threads=thread_candidates(engine.device))
        return p

    try:
        quiet = calibrated()
        with background_load(1):
            busy = calibrated()
    finally:
        torch.set_num_threads(before)
    sizes = probe_sizes(d.budget)
    for p in (quiet, busy):
        curve = p.verify_cost.ms
        assert sorted(curve) == sizes and all(a <= b for a, b in zip(curve.values(), list(curve.values())[1:]))
        assert p.threads in thread_candidates(engine.device) and p.host_budget(d.budget, d.verify_cost_cap) in sizes
    print(f"B_ver quiet {quiet.host_b} ({quiet.threads} threads), busy {busy.host_b} ({busy.threads} threads)")
