"""Sampling is exact: on a tiny model (vocab 16) the tree methods' sampled continuations follow the
target's own processed distribution. Chi-square goodness of fit on 2-token continuations against the
exact distribution (enumerated), cells with expected count < 5 pooled, fixed seeds, alpha = 1e-3."""
import math

import numpy as np
import pytest
import torch

from tests.tiny import VOCAB
from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec
from treegraft.sampling import processed_probs

PROMPT = [3, 5, 7, 3, 5, 7, 3, 5]
N = 1000  # generations per case; the control below shows the test rejects a wrong distribution at this N
Z_999 = 3.0902  # one-sided normal quantile for alpha = 1e-3


def exact_two_token_dist(model, gen):
    with torch.no_grad():
        p1 = processed_probs(model(input_ids=torch.tensor([PROMPT])).logits[0, -1:], gen)[0]  # [V]
        ext = torch.tensor([PROMPT + [y] for y in range(VOCAB)])
        p2 = processed_probs(model(input_ids=ext).logits[:, -1], gen)  # [V, V]
    return (p1[:, None] * p2).numpy().ravel()  # [V * V]


def chi_square(counts, probs):
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    crit = df * (1 - 2 / (9 * df) + Z_999 * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty
    return stat, crit


def sample_counts(engine, method, gen, drafting):
    """(counts [V * V] of the 2-token continuations, draft tokens accepted over all N generations)."""
    counts, accepted = np.zeros(VOCAB * VOCAB), 0
    for seed in range(N):
        res = engine.generate(PROMPT, method, drafting, gen, seed=seed)
        assert len(res.new_tokens) == 2
        counts[res.new_tokens[0] * VOCAB + res.new_tokens[1]] += 1
        accepted += sum(r.accepted for r in res.rounds)
    return counts, accepted


CASES = [  # (engine fixture: the tiny LM mid or the tiny draft head, method, sampling settings)
    ("tiny_engine", "fixed", GenerationConfig(temperature=1.0, max_new_tokens=2)),
    ("tiny_engine", "all-mid", GenerationConfig(temperature=0.8, top_p=0.9, top_k=8, max_new_tokens=2)),
    ("tiny_engine", "all-small", GenerationConfig(temperature=1.2, max_new_tokens=2)),
    ("tiny_head_engine", "all-mid", GenerationConfig(temperature=1.0, max_new_tokens=2)),
]


@pytest.mark.parametrize("fixture, name, gen", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_tree_sampling_matches_target_distribution(request, fixture, name, gen):
    engine = request.getfixturevalue(fixture)
    probs = exact_two_token_dist(engine.pair.target, gen)
    drafting = DraftingConfig(depth=3, width=4, top_k=3, budget=12)
    counts, accepted = sample_counts(engine, MethodSpec(name), gen, drafting)
    stat, crit = chi_square(counts, probs)
    assert stat < crit, f"chi-square {stat:.1f} >= critical {crit:.1f}"
    assert accepted > 0, "no round accepted a draft token: the drafts were never used"


def test_the_check_has_power_against_a_wrong_distribution(tiny_engine):
    """Draws from the mid drafter's distribution (a plausible bug: sampling from q) are rejected."""
    gen = GenerationConfig(temperature=1.0, max_new_tokens=2)
    target = exact_two_token_dist(tiny_engine.pair.target, gen)
    wrong = exact_two_token_dist(tiny_engine.pair.mid, gen)
    counts = np.random.default_rng(0).multinomial(N, wrong / wrong.sum()).astype(float)
    stat, crit = chi_square(counts, target)
    assert stat > crit


def test_ar_sampling_matches_too(tiny_engine):
    gen = GenerationConfig(temperature=1.0, max_new_tokens=2)
    counts, _ = sample_counts(tiny_engine, MethodSpec("ar"), gen, DraftingConfig())
    stat, crit = chi_square(counts, exact_two_token_dist(tiny_engine.pair.target, gen))
    assert stat < crit
