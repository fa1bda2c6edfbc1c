"""The step-1 yield gate: does a mid call at step 1 pay in THIS request? (`DraftingConfig.mid_gate = "yield"`)

The learned scheduler (policy.py) reads the tree, and at step 1 the tree is the root alone: its tree inputs are
constants there, so it cannot tell a chat request, where one head step a round pays (measured 1.09x all-small),
from a summary, where the n-gram drafter already copies the answer and the call is pure cost (0.93x). What
separates them is what the calls have yielded so far in the request, and a verified round says it exactly:

- a call round commits `a` tokens in `t` ms. Without the call it would have committed `a'`: the accepted path's
  leading nodes the n-gram drafter proposed too (`confirmed` bit), plus one where the path's next token is a
  drafted n-gram child the prune left out for the mid's nodes; and taken `t'` = t - the call's cost: the larger
  of its parts in this round (the mid steps' ms, the verification of the mid-only nodes T(n) - T(n'), the logits
  rows of the a - a' extra tokens) and what a call added to a round in trial rounds at load
  (`Engine.calibrate_call`; on a 2-core Zen 5 in fp32 the parts read ~2.3 ms a round and the whole call ~4.4 ms
  on average: a bigger tree costs more tree, mask and cache work than the parts count).
- margin = sum(a) / sum(t) - sum(a') / sum(t') over the request's call rounds (decayed): tokens per ms with the
  call minus without it, the unit of g_psi's margin. The gate calls while it is positive, for the first
  `MIN_CALLS` rounds (no evidence yet) and, once closed, again after `EXPLORE_FIRST` rounds, so it can re-open;
  each such call that leaves it closed doubles the wait (up to `EXPLORE_MAX`): in a request where the call never
  pays (a summary the n-gram drafter copies) exploring costs a call every few rounds, ~5 ms each here.

The later steps are the n-gram drafter's. The learned scheduler is not asked there: trained on all 2^D
schedules, it calls the mid at steps 3-5 of every round that had a step-1 call (margin +0.1 to +0.2 where it
reads -0.2 to -0.7 otherwise), which took those rounds from ~2 to ~12 ms of mid time for no more tokens
(sum-01 of the bench suite, fp32, Zen 5), and without a step-1 call it calls on 0% of steps (final-1204d).
Sampling changes nothing here: the gate only chooses who drafts; acceptance stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..methods import Decision, Policy, RoundOutcome, StepState
from ..tree import MID, SMALL, proposed_by

MIN_CALLS = 2  # call rounds before the margin decides
EXPLORE_FIRST, EXPLORE_MAX = 4, 16  # rounds a closed gate waits before it calls anyway (doubling while it stays closed)
DECAY = 0.9  # per call round: the margin reads about the last ten calls


@dataclass
class Yield:
    """What one call round committed and cost, with the call and (counterfactually) without it."""

    tokens: int  # a: accepted nodes + the bonus token
    ms: float  # t: the round's draft + verification time
    tokens_without: int  # a': what the n-gram drafter's nodes alone would have committed
    ms_without: float  # t'


def round_yield(o: RoundOutcome) -> Yield:
    """A call round's yield (module docstring). The path's leading n-gram nodes are what the n-gram drafter's
    own tree would have accepted; the mid-only nodes cost their verification and the extra tokens' rows."""
    tree, path = o.tree, o.path
    small = proposed_by(tree, path[1:], SMALL)
    lead = int(np.argmin(small)) if not small.all() else len(small)  # accepted n-gram nodes before a mid-only one
    if lead == len(small):  # the whole path is the n-gram's: was its next token drafted by it but cut for the mid's?
        child = tree.child_of.get((int(path[-1]), int(o.bonus)))
        if child is not None and proposed_by(tree, [child], SMALL)[0] and not tree.kept[child]:
            lead += 1
    small_kept = int(proposed_by(tree, o.kept, SMALL).sum())
    verify_with, verify_without = o.verify_ms(np.array([len(o.kept), small_kept]))
    extra = max(0, len(path) - 1 - lead)  # tokens only the mid's nodes gave
    parts = o.mid_ms + max(0.0, float(verify_with - verify_without)) + extra * o.row_ms
    saved = max(parts, o.call_ms)  # the parts miss what a bigger tree costs elsewhere (measured at load: call_ms)
    return Yield(len(path), o.round_ms, lead + 1, max(o.round_ms - saved, 1e-3))


class YieldGate:
    """Decayed sums of the request's call rounds (module docstring)."""

    def __init__(self):
        self.calls = 0
        self.since_call = 0  # rounds since the last call round
        self.wait = EXPLORE_FIRST  # rounds a closed gate waits before its next call
        self.tokens = self.ms = self.tokens_without = self.ms_without = 0.0

    @property
    def margin(self) -> float | None:
        """Tokens per ms with the step-1 call minus without it, over this request's call rounds (None: none yet)."""
        if self.calls == 0:
            return None
        return self.tokens / self.ms - self.tokens_without / self.ms_without

    def wants_call(self) -> bool:
        m = self.margin
        return self.calls < MIN_CALLS or (m is not None and m > 0) or self.since_call >= self.wait - 1

    def observe(self, called: bool, y: Yield | None) -> None:
        if not called or y is None:
            self.since_call += 1
            return
        explored = self.calls >= MIN_CALLS and not self.margin > 0  # a call made while the gate was closed
        self.calls += 1
        self.since_call = 0
        self.tokens = DECAY * self.tokens + y.tokens
        self.ms = DECAY * self.ms + y.ms
        self.tokens_without = DECAY * self.tokens_without + y.tokens_without
        self.ms_without = DECAY * self.ms_without + y.ms_without
        if self.margin > 0:
            self.wait = EXPLORE_FIRST
        elif explored:
            self.wait = min(2 * self.wait, EXPLORE_MAX)


class GatedPolicy(Policy):
    """`treegraft` with `mid_gate = "yield"`: step 1 by the request's yield gate, the later steps the n-gram
    drafter's. The margin it reports at step 1 is the gate's (tokens per ms, as g_psi's)."""

    name = "treegraft"
    calls_every_round = True  # it calls at the first rounds of every request: the mid reads the prompt in the prefill
    observes = True

    def __init__(self):
        self.gate, self.called = YieldGate(), False

    def start_round(self) -> None:
        self.called = False

    def decide(self, st: StepState) -> Decision:
        if st.k > 1:
            return Decision(SMALL)
        self.called = self.gate.wants_call()
        return Decision(MID if self.called else SMALL, self.gate.margin, by="yield")

    def observe(self, outcome: RoundOutcome) -> None:
        self.gate.observe(self.called, round_yield(outcome) if self.called else None)
