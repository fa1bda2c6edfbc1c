"""Lossless: in float32 every method's greedy output equals the target's plain greedy decoding."""
import pytest

from treegraft.config import GenerationConfig, load_pair
from treegraft.methods import MethodSpec
from treegraft.prompts import load_prompts

PROMPTS = load_prompts("default")
GEN = GenerationConfig(max_new_tokens=64)
BASE = load_pair("default").drafting  # the pair's own settings (B_ver = 8)
VARIANTS = [  # (method, schedule, eg, nd, B_ver)
    ("all-small", (1, 0, 1, 0, 1), True, True, BASE.budget),
    ("all-mid", (1, 0, 1, 0, 1), True, True, BASE.budget),
    ("fixed", (1, 0, 1, 0, 1), True, True, BASE.budget),
    ("fixed", (0, 1, 1, 0, 0), True, True, 63),  # the paper's budget: big trees
    ("fixed", (1, 0, 1, 0, 1), False, True, BASE.budget),  # --no-eg
    ("fixed", (0, 0, 1, 0, 1), True, False, BASE.budget),  # --no-nd
    ("treegraft", (1, 0, 1, 0, 1), True, True, BASE.budget),  # the learned scheduler
]


def test_suite_has_varied_prompts():
    assert len(PROMPTS) >= 12
    assert {"chat", "code", "summarisation", "qa", "math", "translation"} <= {p.category for p in PROMPTS}


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.id for p in PROMPTS])
def test_every_method_matches_plain_greedy(engine, prompt):
    ids = engine.encode(prompt.messages)
    ar = engine.generate(ids, MethodSpec("ar"), BASE, GEN)
    assert ar.dtype == "float32" and len(ar.new_tokens) > 0
    for name, schedule, eg, nd, budget in VARIANTS:
        spec = MethodSpec(name, eg=eg, nd=nd)
        drafting = BASE.model_copy(update={"schedule": schedule, "budget": budget})
        res = engine.generate(ids, spec, drafting, GEN)
        first_diff = next((i for i, (a, b) in enumerate(zip(ar.new_tokens, res.new_tokens)) if a != b), None)
        assert res.new_tokens == ar.new_tokens, f"{spec.label} {schedule}: first difference at {first_diff}"
        assert sum(r.accepted + 1 for r in res.rounds) >= len(res.new_tokens)
