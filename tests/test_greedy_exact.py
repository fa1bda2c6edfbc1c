"""Lossless: in float32 every method's greedy output equals the target's plain greedy decoding.

The reference is Hugging Face's own `generate` (greedy) on the target; the engine's AR must match it too.
`make test` runs every method on three prompts (chat, code, summarisation with its source text) x 40 tokens;
the full sweep, all 13 prompts x 64 tokens, is marked slow (`make test-all`, and CI after `make test`).
"""
import pytest
import torch

from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import MethodSpec
from treegraft.prompts import load_prompts

PROMPTS = load_prompts("default")
FAST = [p for p in PROMPTS if p.id in ("chat-01", "code-02", "sum-01")]
GEN = GenerationConfig(max_new_tokens=64)
FAST_GEN = GenerationConfig(max_new_tokens=40)
BASE = load_pair("default").drafting  # the pair's own settings (B_ver = 8, adaptive budget)
VARIANTS = [  # (method, schedule, eg, nd, B_ver, adaptive budget[, other drafting settings])
    ("all-small", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"depth_gate": "off"}),  # all D steps a round
    ("all-small", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"depth_gate": "yield"}),  # the depth gate's steps
    ("all-mid", (1, 0, 1, 0, 1), True, True, BASE.budget, True),
    ("fixed", (1, 0, 1, 0, 1), True, True, BASE.budget, False),
    ("fixed", (0, 1, 1, 0, 0), True, True, 63, False),  # the paper's budget: big trees, all verified
    ("fixed", (1, 0, 1, 0, 1), False, True, BASE.budget, True),  # --no-eg
    ("fixed", (0, 0, 1, 0, 1), True, False, BASE.budget, True),  # --no-nd
    ("treegraft", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"mid_gate": "off"}),  # the learned scheduler
    # step 1 by the yield gate, all D steps / the depth gate's
    ("treegraft", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"mid_gate": "yield", "depth_gate": "off"}),
    ("treegraft", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"mid_gate": "yield", "depth_gate": "yield"}),
    # a call round's step 1 alone the head's (the pair's own mid_lead is 2: its first two)
    ("treegraft", (1, 0, 1, 0, 1), True, True, BASE.budget, True, {"mid_gate": "yield", "mid_lead": 1}),
    ("oracle", (1, 0, 1, 0, 1), True, True, BASE.budget, True),  # value-model search at every step
    ("csd", (1, 0, 1, 0, 1), True, True, BASE.budget, True),  # the sequence-level cascade
]


def test_suite_has_varied_prompts():
    assert len(PROMPTS) >= 12
    assert {"chat", "code", "summarisation", "qa", "math", "translation"} <= {p.category for p in PROMPTS}


def test_fast_set_covers_the_kinds_of_text():
    assert {p.category for p in FAST} == {"chat", "code", "summarisation"}


@pytest.mark.parametrize("prompt", FAST, ids=[p.id for p in FAST])
def test_every_method_matches_plain_greedy(engine, fp32_pair, prompt):
    check_every_method(engine, fp32_pair, prompt, FAST_GEN)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.id for p in PROMPTS])
def test_every_method_matches_plain_greedy_full_sweep(engine, fp32_pair, prompt):
    check_every_method(engine, fp32_pair, prompt, GEN)


def check_every_method(engine, fp32_pair, prompt, gen):
    ids = engine.encode(prompt.messages)
    ar = engine.generate(ids, MethodSpec("ar"), BASE, gen)
    assert ar.dtype == "float32" and len(ar.new_tokens) > 0
    assert ar.new_tokens == hf_greedy(engine, fp32_pair, ids, gen), "the engine's AR differs from HF generate"
    for name, schedule, eg, nd, budget, adaptive, *more in VARIANTS:
        spec = MethodSpec(name, eg=eg, nd=nd)
        drafting = BASE.model_copy(update={"schedule": schedule, "budget": budget, "adaptive_budget": adaptive,
                                           **(more[0] if more else {})})
        res = engine.generate(ids, spec, drafting, gen)
        first_diff = next((i for i, (a, b) in enumerate(zip(ar.new_tokens, res.new_tokens)) if a != b), None)
        assert res.new_tokens == ar.new_tokens, f"{spec.label} {schedule} {more}: first difference at {first_diff}"
        assert sum(r.accepted + 1 for r in res.rounds) >= len(res.new_tokens)


def hf_greedy(engine, pair, ids: list[int], gen: GenerationConfig) -> list[int]:
    """Hugging Face's own greedy decoding of the target, cut like the engine's (first EOS, max tokens)."""
    x = torch.tensor([ids])
    out = pair.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=gen.max_new_tokens,
                               do_sample=False, pad_token_id=engine.tokenizer.eos_token_id)
    return engine.trim(out[0, len(ids):].tolist(), gen.max_new_tokens)
