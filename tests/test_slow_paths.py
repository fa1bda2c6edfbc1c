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
def test_calibration_on_a_busy_host_keeps_b_ver_within_one_bucket(engine):
    """One CPU-bound process beside the calibration (the 2 cores shared): the B_ver it sets is within one probe
    bucket of a quiet calibration's."""
    from treegraft.load import background_load
    from treegraft.prune import Pruner, bucket_of, probe_sizes

    d = load_pair("default").drafting
    ids = engine.encode("Summarise the plot of a famous novel in three sentences.")

    def b_ver():
        p = Pruner()
        p.calibrate(engine.target, ids, d.budget, d.verify_cost_cap)
        return p.host_budget(d.budget, d.verify_cost_cap), p.verify_cost.ms

    quiet, quiet_curve = b_ver()
    with background_load(1):
        busy, busy_curve = b_ver()
    sizes = probe_sizes(d.budget)
    assert abs(bucket_of(busy, sizes) - bucket_of(quiet, sizes)) <= 1, (quiet_curve, busy_curve)
