"""The depth gate: how many of the D draft steps a round takes in THIS request (`DraftingConfig.depth_gate = "yield"`).

A draft step pays when the tokens its nodes add to the accepted path are worth more than the step costs: its
drafting time and the verification of the nodes it adds. On a 2-core Zen 2 in fp32 (12 bench prompts, docs/tuning.md)
all-small's steps 1-5 cost 0.30 / 0.58 / 0.42 / 0.33 / 0.26 ms a round and its accepted paths took 1.228 / 0.125 /
0.010 / 0.006 / 0.000 tokens a round from the nodes each step added: steps 3-5 cost ~1 ms a round for ~0.02 tokens.
How deep pays is a property of the host (a step's ms against a token's) and of the request (a summary that copies
its source extends its spans step after step), so a fixed D is one machine's answer; the gate measures it.

Per step k, over the request's rounds that took step k (decayed means, so the estimates follow the request):
- m_k: the accepted path's nodes added at step k (a node's step is never below its parent's, so the path's first
  nodes up to step d are what a round of d steps could have accepted; the bonus token comes either way);
- c_k: step k's cost, its draft ms plus T(n) - T(n - n_k) for the n_k of its nodes the cut verified;
and b, a round's ms less its steps' costs. (Charging each step a share of the round's other bookkeeping, the prune,
the cut and the acceptance walk, by the nodes it added was tried: the gate then ended treegraft's rounds too early,
0.997x of D = 5 against 1.022x without it; docs/tuning.md.) A round takes
d* = argmax_d (1 + sum_{k<=d} m_k) / (b + sum_{k<=d} c_k) steps, the depth with the most tokens per ms (means kept
apart by who took step 1: `DepthGate`). A round whose step 1 is a head call takes at least the n-gram drafter's
first step: step 2, or `mid_lead` + 1 where a call round's first `mid_lead` steps are the head's (the default pair:
3). So the call only adds to what the n-gram drafter finds (and the yield gate's
counterfactual, what the n-gram drafter's nodes alone would have committed, has those nodes to read). Without that
floor a request whose first call rounds accepted nothing learned d* = 1 for them and ran the head alone from then
on: on a translation the n-gram drafter copies (unseen-translation-01, fp32, 2026-12-06), 11 rounds of head-only
trees accepted 0.4 tokens a round where all-small's accepted 1-3, and the yield gate, comparing against an n-gram
subtree that was never drafted, read every call as a gain. The first `MIN_ROUNDS` rounds take all D, so that every
step is measured; after that every `EXPLORE`-th round takes one step more than d*, so the next step's means stay
measured (a deeper step that starts to pay is found one step per exploration; exploring all D instead cost ~1 ms a
round in ~30% of a 64-token request's rounds). Acceptance is untouched: a shallower tree is verified exactly like a
deeper one.
"""
from __future__ import annotations

import numpy as np

MIN_ROUNDS = 2  # rounds of all D steps before the gate decides
EXPLORE = 4  # after that, every EXPLORE-th round takes one step more than the best depth
DECAY = 0.8  # per observation: a step's means read about its last five rounds


class StepMeans:
    """Decayed per-step means of a request's rounds of one kind (module docstring)."""

    def __init__(self, depth: int, least: int = 1):
        self.depth = depth  # D
        self.least = min(least, depth)  # the fewest steps a round takes (2 after a head call at step 1)
        self.rounds = 0
        self.w = np.zeros(depth + 1)  # [D + 1] decayed observation weights, by step (index 0 unused)
        self.tokens = np.zeros(depth + 1)  # [D + 1] decayed sums of m_k
        self.ms = np.zeros(depth + 1)  # [D + 1] decayed sums of c_k
        self.base_w = self.base_ms = 0.0  # decayed sums of b

    def steps(self) -> int:
        """The number of draft steps the next round takes."""
        if self.rounds < MIN_ROUNDS:
            return self.depth
        explore = (self.rounds - MIN_ROUNDS) % EXPLORE == EXPLORE - 1
        return min(self.depth, self.best() + explore)

    def best(self) -> int:
        """d* = argmax_{d >= least} tokens per ms of a round of d steps, on the measured means (D where a step is
        unmeasured)."""
        if self.base_w == 0.0 or not (self.w[1:] > 0).all():
            return self.depth
        m = self.tokens[1:] / self.w[1:]  # [D]
        c = self.ms[1:] / self.w[1:]  # [D]
        rate = (1.0 + np.cumsum(m)) / (self.base_ms / self.base_w + np.cumsum(c))  # [D], by d = 1..D
        return int(np.argmax(rate[self.least - 1:])) + self.least  # the shallowest of equal rates

    def expected(self) -> dict | None:
        """What the gate reads: {m_k}, {c_k} (ms) and b (ms); None before any round."""
        if self.base_w == 0.0:
            return None
        seen = np.flatnonzero(self.w > 0)
        return {"tokens": {int(k): float(self.tokens[k] / self.w[k]) for k in seen},
                "ms": {int(k): float(self.ms[k] / self.w[k]) for k in seen},
                "base_ms": self.base_ms / self.base_w}

    def observe(self, tree, kept: np.ndarray, path: list[int], step_ms: list[float], round_ms: float,
                verify_ms) -> None:
        """Learn from a verified round: its tree, the verified non-root nodes `kept` [n], the accepted `path` (root
        first), each step's draft ms (step k at k - 1) and the round's ms; `verify_ms(n [m]) -> [m]` is T(n)."""
        self.rounds += 1
        taken = len(step_ms)
        on_path = np.bincount(tree.step[np.asarray(path[1:], dtype=np.int64)], minlength=taken + 1)  # [>= taken + 1]
        per_step = np.bincount(tree.step[np.asarray(kept, dtype=np.int64)], minlength=taken + 1)  # [>= taken + 1]
        without = len(kept) - per_step[1:taken + 1]  # [taken] verified nodes had step k added none
        t = verify_ms(np.concatenate([[len(kept)], without]))  # [taken + 1] T(n), then T(n - n_k) per step
        cost = np.asarray(step_ms) + np.where(per_step[1:taken + 1] > 0, np.maximum(t[0] - t[1:], 0.0), 0.0)  # [taken]
        steps = slice(1, taken + 1)
        self.w[steps] = DECAY * self.w[steps] + 1.0
        self.tokens[steps] = DECAY * self.tokens[steps] + on_path[steps]
        self.ms[steps] = DECAY * self.ms[steps] + cost
        self.base_w = DECAY * self.base_w + 1.0
        self.base_ms = DECAY * self.base_ms + max(round_ms - float(cost.sum()), 1e-3)


class DepthGate:
    """The gate's means kept apart by who took step 1 ("small" or "mid"): in treegraft a round whose step 1 is a head
    call has the n-gram drafter's first step at step 2, so its steps are not those of a round without the call, and
    it takes at least that step (module docstring); the depth is chosen once step 1 is taken."""

    def __init__(self, depth: int, mid_lead: int = 1):
        self.depth = depth  # D
        self.mid_lead = mid_lead  # a call round's leading mid steps (DraftingConfig.mid_lead)
        self.by_first: dict[str, StepMeans] = {}

    def of(self, first: str = "small") -> StepMeans:
        """The means of the rounds whose step 1 `first` took (created at its first round)."""
        if first not in self.by_first:
            least = self.mid_lead + 1 if first == "mid" else 1  # the call's steps, then the n-gram drafter's first
            self.by_first[first] = StepMeans(self.depth, least=least)
        return self.by_first[first]
