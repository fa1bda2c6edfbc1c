"""Lossless: in float32 every method's greedy output equals the target's plain greedy decoding."""
import pytest

from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec
from treegraft.prompts import load_prompts

PROMPTS = load_prompts("default")
GEN = GenerationConfig(max_new_tokens=64)
VARIANTS = [
    ("all-small", (1, 0, 1, 0, 1), True, True),
    ("all-mid", (1, 0, 1, 0, 1), True, True),
    ("fixed", (1, 0, 1, 0, 1), True, True),
    ("fixed", (0, 1, 1, 0, 0), True, True),
    ("fixed", (1, 0, 1, 0, 1), False, True),  # --no-eg
    ("fixed", (0, 0, 1, 0, 1), True, False),  # --no-nd
    ("treegraft", (1, 0, 1, 0, 1), True, True),  # the learned scheduler
]


def test_suite_has_varied_prompts():
    assert len(PROMPTS) >= 12
    assert {"chat", "code", "summarisation", "qa", "math", "translation"} <= {p.category for p in PROMPTS}


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.id for p in PROMPTS])
def test_every_method_matches_plain_greedy(engine, prompt):
    ids = engine.encode(prompt.messages)
    ar = engine.generate(ids, MethodSpec("ar"), DraftingConfig(), GEN)
    assert ar.dtype == "float32" and len(ar.new_tokens) > 0
    for name, schedule, eg, nd in VARIANTS:
        spec = MethodSpec(name, eg=eg, nd=nd)
        res = engine.generate(ids, spec, DraftingConfig(schedule=schedule), GEN)
        first_diff = next((i for i, (a, b) in enumerate(zip(ar.new_tokens, res.new_tokens)) if a != b), None)
        assert res.new_tokens == ar.new_tokens, f"{spec.label} {schedule}: first difference at {first_diff}"
        assert sum(r.accepted + 1 for r in res.rounds) >= len(res.new_tokens)
