"""The step-1 yield gate: does a mid call at step 1 pay in THIS request? (`DraftingConfig.mid_gate = "yield"`)

The learned scheduler (policy.py) reads the tree, and at step 1 the tree is the root alone: its tree inputs are
constants there, so it cannot tell a chat request, where one head step a round pays (measured 1.09x all-small),
from a summary, where the n-gram drafter already copies the answer and the call is pure cost (0.93x). What
separates them is what the calls have yielded so far in the request, and a verified round says it exactly:

- a call round commits `a` tokens in `t` ms. Without the call it would have committed `a'`: the accepted path's
  leading nodes that an all-small round would have verified, i.e. what the cost-aware cut makes of the tree's
  n-gram nodes scored by the n-gram drafter alone (`Pruner.cut_among`), plus one where the path's next token is
  among them; and taken `t'` = t - the call's cost in this round: the mid steps' ms, the verification of the nodes
  the call added to that cut, T(n) - T(n'), and the logits rows of the a - a' extra tokens. (Until 2026-12-05 the
  cost was at least what a call added to a round in trial rounds at load, `Engine.calibrate_call`: that figure
  read 1.0-7.4 ms across runs, while these parts, against trial rounds from the same states, read 3.7 ms where
  the truth was 3.6 ms; with a load figure of 6.9 ms the gate called in 58% of replayed rounds, not 90%.) Until
  2026-12-05 too, a' counted
  the path's leading n-gram nodes that the cut kept: where the mid confirms an n-gram node its score rises and the
  cut keeps deeper n-gram nodes than all-small would, so that read a' 2.83 where the same states' all-small trial
  rounds accepted 2.55 (bench suite, fp32, Zen 5), and the gate closed where calls paid. Now: 2.39 vs 2.38, and
  2.85 vs 2.82 on the unseen suite.
- margin = sum(a) / sum(t) - sum(a') / sum(t') over the request's call rounds (decayed): tokens per ms with the
  call minus without it, the unit of g_psi's margin. A call round's x = (a - a') - rho (t - t'), rho =
  sum(a') / sum(t'), varies with sd 0.7-0.8 tokens within a request (both suites), while requests' mean x spread
  from -1.3 to +0.9: two calls say little. So the gate decides on an upper bound, the margin plus Z standard
  errors (x's spread shrunk toward PRIOR_SD), and calls while it is positive: it closes only where the calls are
  measured to lose (a summary the n-gram drafter copies), for the first `MIN_CALLS` rounds it calls anyway, and,
  once closed, calls again after `EXPLORE_FIRST` rounds, so it can re-open; each such call that leaves it closed
  doubles the wait (up to `EXPLORE_MAX`). Replayed on trial rounds of both suites (every state run with and
  without a step-1 call), the mean-only rule kept 1.036x of all-small's speed, the bound 1.053x, calling always
  1.052x.

A call round's steps 2..`mid_lead` are the head's too (`DraftingConfig.mid_lead`; the default pair 2, its chain two
deep: 1.011-1.017x the speed of a step-1 call alone paired, docs/tuning.md); the later steps are the n-gram drafter's.
The learned scheduler is not asked there: trained on all 2^D
schedules, it calls the mid at steps 3-5 of every round that had a step-1 call (margin +0.1 to +0.2 where it
reads -0.2 to -0.7 otherwise), which took those rounds from ~2 to ~12 ms of mid time for no more tokens
(sum-01 of the bench suite, fp32, Zen 5), and without a step-1 call it calls on 0% of steps (final-1204d).
Sampling changes nothing here: the gate only chooses who drafts; acceptance stays exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..methods import Decision, Policy, RoundOutcome, StepState
from ..tree import MID, SMALL, proposed_by

MIN_CALLS = 2  # call rounds before the bound decides
EXPLORE_FIRST, EXPLORE_MAX = 4, 16  # rounds a closed gate waits before it calls anyway (doubling while it stays closed)
DECAY = 0.9  # per call round: the margin reads about the last ten calls
Z = 2.0  # the gate closes where the margin is below 0 by this many standard errors, not where it merely is
PRIOR_SD, PRIOR_ROUNDS = 0.75, 4  # x's spread within a request (tokens; measured 0.7-0.8 on both suites), worth
# this many call rounds: two calls that happened to yield nothing do not close the gate


@dataclass
class Yield:
    """What one call round committed and cost, with the call and (counterfactually) without it."""

    tokens: int  # a: accepted nodes + the bonus token
    ms: float  # t: the round's draft + verification time
    tokens_without: int  # a': what the n-gram drafter's nodes alone would have committed
    ms_without: float  # t'


def ngram_subtree(tree) -> np.ndarray:
    """[m] the live non-root nodes the n-gram drafter proposed, every ancestor too (index order): the tree an
    all-small round could have drafted."""
    n = tree.n
    small = proposed_by(tree, np.arange(n), SMALL) & tree.alive[:n]
    ok = np.zeros(n, dtype=bool)
    ok[0] = True
    parent = tree.parent
    for v in range(1, n):
        ok[v] = small[v] and ok[parent[v]]
    return np.flatnonzero(ok[1:]) + 1


def round_yield(o: RoundOutcome) -> Yield:
    """A call round's yield (module docstring). Without the call, the round would have verified what the cut makes of
    the n-gram drafter's nodes scored by it alone (`o.small_cut`), and accepted the path's leading nodes among them;
    the mid-only nodes cost their verification and the extra tokens' rows."""
    tree, path = o.tree, o.path
    cut = o.small_cut(tree, ngram_subtree(tree))
    verified = np.zeros(tree.n, dtype=bool)
    verified[cut] = True
    on = verified[np.asarray(path[1:], dtype=np.int64)]
    lead = int(np.argmin(on)) if not on.all() else len(on)  # accepted n-gram nodes before one it would not verify
    if lead == len(on):  # the whole path is the n-gram's: would its next token have been verified without the mid's?
        child = tree.child_of.get((int(path[-1]), int(o.bonus)))
        if child is not None and verified[child] and not tree.kept[child]:
            lead += 1
    verify_with, verify_without = o.verify_ms(np.array([len(o.kept), len(cut)]))
    extra = max(0, len(path) - 1 - lead)  # tokens only the mid's nodes gave
    saved = o.mid_ms + max(0.0, float(verify_with - verify_without)) + extra * o.row_ms  # what the call cost
    return Yield(len(path), o.round_ms, lead + 1, max(o.round_ms - saved, 1e-3))


class YieldGate:
    """Decayed sums over the request's call rounds (module docstring): O(1) to update and to read."""

    def __init__(self):
        self.calls = 0
        self.since_call = 0  # rounds since the last call round
        self.wait = EXPLORE_FIRST  # rounds a closed gate waits before its next call
        # decayed sums: weights, their squares, a, t, a', t', then (a - a')^2, (a - a')(t - t'), (t - t')^2
        self.w = self.w2 = self.tokens = self.ms = self.tokens_without = self.ms_without = 0.0
        self.da2 = self.dadt = self.dt2 = 0.0

    @property
    def margin(self) -> float | None:
        """Tokens per ms with the step-1 call minus without it, over this request's call rounds (None: none yet)."""
        if self.calls == 0:
            return None
        return self.tokens / self.ms - self.tokens_without / self.ms_without

    @property
    def bound(self) -> float | None:
        """The margin plus Z standard errors: what the gate decides on. Per call round, x = (a - a') - rho (t - t'),
        rho = sum(a') / sum(t') the rate without calls, so margin = sum(x) / sum(t) exactly; its standard error is
        x's over the effective number of rounds, over the mean t, x's spread shrunk toward PRIOR_SD."""
        m = self.margin
        if m is None:
            return None
        rho = self.tokens_without / self.ms_without
        sx = (self.tokens - self.tokens_without) - rho * (self.ms - self.ms_without)  # sum of w x
        sxx = self.da2 - 2 * rho * self.dadt + rho * rho * self.dt2  # sum of w x^2
        spread = max(sxx - sx * sx / self.w, 0.0)  # sum of w (x - mean)^2
        sd = math.sqrt((PRIOR_ROUNDS * PRIOR_SD ** 2 + spread) / (PRIOR_ROUNDS + self.w))
        n_eff = self.w * self.w / self.w2
        return m + Z * sd / math.sqrt(n_eff) / (self.ms / self.w)

    def wants_call(self) -> bool:
        b = self.bound
        return self.calls < MIN_CALLS or (b is not None and b > 0) or self.since_call >= self.wait - 1

    def observe(self, called: bool, y: Yield | None) -> None:
        if not called or y is None:
            self.since_call += 1
            return
        explored = self.calls >= MIN_CALLS and not self.bound > 0  # a call made while the gate was closed
        self.calls += 1
        self.since_call = 0
        da, dt = y.tokens - y.tokens_without, y.ms - y.ms_without
        for name, value in (("w", 1.0), ("w2", 1.0), ("tokens", y.tokens), ("ms", y.ms),
                            ("tokens_without", y.tokens_without), ("ms_without", y.ms_without),
                            ("da2", da * da), ("dadt", da * dt), ("dt2", dt * dt)):
            setattr(self, name, (DECAY * DECAY if name == "w2" else DECAY) * getattr(self, name) + value)
        if self.bound > 0:
            self.wait = EXPLORE_FIRST
        elif explored:
            self.wait = min(2 * self.wait, EXPLORE_MAX)


class GatedPolicy(Policy):
    """`treegraft` with `mid_gate = "yield"`: step 1 by the request's yield gate; in a call round steps 2..`lead`
    the mid's too (`DraftingConfig.mid_lead`), the later steps the n-gram drafter's. The margin it reports at
    step 1 is the gate's bound (tokens per ms, as g_psi's margin)."""

    name = "treegraft"
    calls_every_round = True  # it calls at the first rounds of every request: the mid reads the prompt in the prefill
    observes = True

    def __init__(self, lead: int = 1):
        self.gate, self.called, self.lead = YieldGate(), False, lead

    def start_round(self) -> None:
        self.called = False

    def decide(self, st: StepState) -> Decision:
        if st.k > 1:
            return Decision(MID if self.called and st.k <= self.lead else SMALL)
        self.called = self.gate.wants_call()
        return Decision(MID if self.called else SMALL, self.gate.bound, by="yield")

    def observe(self, outcome: RoundOutcome) -> None:
        self.gate.observe(self.called, round_yield(outcome) if self.called else None)
