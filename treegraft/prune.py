"""Pruning before verification (SPEC 2.3), and the cost-aware cut of the verification budget.

Three budgets, each defined once (names as in `DraftingConfig`):

- B_ver (`budget`): after all D draft steps, `prune` keeps exactly min(B_ver, nodes)
  non-root nodes, best path score first, closed under ancestors (the paper's rule).
- the cost-aware cut (`adaptive_budget`): of those, `Pruner.select` verifies only the
  n <= B_ver that pay for their verification time on this host (below). With it, B_ver
  itself follows the host (`verify_cost_cap`, default 1.6): it shrinks to the largest
  probed n whose measured T(n) <= cap x T(0). Where verification is nearly flat in n
  (a GPU, a CPU with fast bf16 matrix units) trees grow to the configured 63; where each
  node costs (a 2-core AVX2 CPU in fp32: T(8) ~ 1.5 T(0)) they stay small.
- B0 (`mid_budget`): the most mid calls a round may make (the scheduler's; see
  scheduler/policy.py), not a pruning budget.

The cost-aware cut. SPEC 3 verifies the B_ver best nodes every round. On a GPU a
verification costs about the same for 1 or 63 nodes; on a CPU it does not: on the
2-core AVX2 machine a SmolLM2-135M forward takes ~50 ms for one token and ~80-100 ms
for 2-16. A tree that will probably be rejected then costs more than it can return.
So the n nodes (0 <= n <= B_ver) with the highest estimated path acceptance pi(v) are
kept, n maximising  E_n - (T(n) - T(0)) / T(0):  the expected accepted tokens of the n
nodes, minus their extra verification time counted in plain decoding steps. n = 0
verifies the root alone: exactly a plain decoding step. Greedy and sampled outputs
are unchanged (acceptance is lossless for any tree, including none).

- pi(v) = prod over the path of c(u), c(u) = P(u accepted | its parent accepted),
  learned online from the engine's own verifications (`AcceptanceModel`), in bins
  of the node's own p, per proposer (small only / mid only / both); the prior of a
  bin is the drafter's own p.
- T(n): running means of the measured verification time per node count
  (`VerifyCost`), seeded by one probe of a few sizes before the first generation's
  clock starts (`Pruner.calibrate`).
"""
from __future__ import annotations

import numpy as np

from .kv import timed
from .profile import profiled
from .tree import SMALL, DraftTree, add_child

P_EDGES = np.array([0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9])  # bin upper edges of a node's own p
PRIOR_STRENGTH = 4.0  # pseudo-observations at the drafter's own p
DECAY = 0.995  # per round: recent rounds weigh more (the prompt's kind changes acceptance)
EXPLORE_AFTER = 8  # after this many rounds in a row that verified nothing of a drafted tree, verify one whole


class AcceptanceModel:
    """c(u) = P(u accepted | parent accepted) per (proposer, p-bin), Beta-smoothed toward p."""

    def __init__(self):
        self.hits = np.zeros((3, len(P_EDGES) + 1))  # [proposer, bin]
        self.trials = np.zeros((3, len(P_EDGES) + 1))

    @staticmethod
    def cells(tree: DraftTree, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = np.exp(tree.logp[nodes])  # [n]
        proposer = np.clip(tree.confirmed[nodes].astype(np.int64), 1, 3) - 1  # small, mid, both
        return proposer, np.digitize(p, P_EDGES), p

    def conditional(self, tree: DraftTree, nodes: np.ndarray) -> np.ndarray:
        """[n] c(u) for nodes."""
        who, b, p = self.cells(tree, nodes)
        return (self.hits[who, b] + PRIOR_STRENGTH * p) / (self.trials[who, b] + PRIOR_STRENGTH)

    def path_acceptance(self, tree: DraftTree, nodes: np.ndarray) -> np.ndarray:
        """[n] pi(v) for an ancestor-closed node set in index order (parents first)."""
        c = self.conditional(tree, nodes)
        pi = np.ones(tree.n)
        for v, cv in zip(nodes.tolist(), c.tolist()):
            pi[v] = pi[tree.parent[v]] * cv
        return pi[nodes]

    def update(self, tree: DraftTree, nodes: np.ndarray, path: list[int]) -> None:
        """Learn from one verification: every verified node whose parent was accepted is one trial."""
        self.hits *= DECAY
        self.trials *= DECAY
        on_path = np.zeros(tree.n, dtype=bool)
        on_path[path] = True
        tried = nodes[on_path[tree.parent[nodes]]]
        who, b, _ = self.cells(tree, tried)
        np.add.at(self.trials, (who, b), 1.0)
        np.add.at(self.hits, (who, b), on_path[tried].astype(float))


class VerifyCost:
    """T(n): verification wall time (ms) for n non-root nodes, running means per measured n."""

    def __init__(self):
        self.ms: dict[int, float] = {}

    def __bool__(self) -> bool:
        return 0 in self.ms and len(self.ms) > 1

    def observe(self, n: int, ms: float) -> None:
        old = self.ms.get(n)
        self.ms[n] = ms if old is None else 0.8 * old + 0.2 * ms

    def largest_within(self, cap: float) -> int:
        """The largest measured n with T(n) <= cap x T(0) (at least 1)."""
        keys = np.array(sorted(self.ms))
        t = self(keys)
        return int(max(1, keys[t <= cap * t[0]].max()))

    def growth(self, n: int = 8) -> float:
        """log T(n) / T(0): how fast verification cost grows with the tree here (0 before calibration)."""
        return float(np.log(self(np.array([n]))[0] / self.ms[0])) if self else 0.0

    def __call__(self, n: np.ndarray) -> np.ndarray:
        """T at n, interpolated; made non-decreasing in n (more nodes never cost less; the means are noisy)."""
        keys = np.array(sorted(self.ms))
        return np.interp(n, keys, np.maximum.accumulate([self.ms[k] for k in keys]))


def probe_sizes(budget: int) -> list[int]:
    """The node counts the first probe measures: 0, 1, 2, 4, ... and B_ver."""
    sizes = [0] + [1 << i for i in range(10) if 1 << i < budget]
    return sizes + [budget]


def choose(pi: np.ndarray, cost: VerifyCost) -> tuple[np.ndarray, float]:
    """(order of the chosen nodes, best n's gain): the top-n nodes by pi maximising E_n - (T(n) - T(0)) / T(0)."""
    order = np.lexsort((np.arange(len(pi)), -pi))  # ties: index order keeps parents first
    n = np.arange(len(pi) + 1)
    expected = np.concatenate([[0.0], np.cumsum(pi[order])])  # [n + 1] E_n
    t = cost(n)
    gain = expected - (t - t[0]) / t[0]
    best = int(np.argmax(gain))
    return order[:best], float(gain[best])


def prune(tree: DraftTree, budget: int) -> np.ndarray:
    """Keep exactly min(budget, live non-root nodes) nodes, best path score first, closed under ancestors.

    Returns the kept non-root nodes in index order and sets `tree.kept` (the root is always kept).
    """
    live = tree.live()[1:]
    target = min(budget, len(live))
    kept = tree.kept
    kept[: tree.n] = False
    kept[0] = True
    order = live[np.lexsort((live, tree.depth[live], -tree.score[live]))]
    count = 0
    for v in order:
        if count == target:
            break
        if kept[v]:
            continue
        chain = []
        u = int(v)
        while not kept[u]:
            chain.append(u)
            u = int(tree.parent[u])
        if count + len(chain) <= target:
            kept[chain] = True
            count += len(chain)
    return np.flatnonzero(kept[: tree.n])[1:]


class Pruner:
    """B_ver, then the cost-aware cut; learns T(n) and the acceptance model from each verification."""

    def __init__(self):
        self.acceptance = AcceptanceModel()  # learned across generations
        self.verify_cost = VerifyCost()
        self.idle = 0  # committed rounds in a row that verified none of their drafted nodes

    @profiled("prune")
    def select(self, tree: DraftTree, budget: int, adaptive: bool, cap: float | None = None) -> np.ndarray:
        """The kept non-root nodes (index order; tree.kept updated). Uncalibrated: the pruned tree."""
        if not adaptive or not self.verify_cost:
            return prune(tree, budget)
        kept = prune(tree, self.host_budget(budget, cap))
        order, _ = choose(self.acceptance.path_acceptance(tree, kept), self.verify_cost)
        if len(order) == 0 and self.idle >= EXPLORE_AFTER - 1:
            # Exploration: T(n) and the acceptance model learn only from what is verified, so one noisy
            # calibration (T(1) measured far above T(0)) could make the cut verify nothing ever again.
            # Every EXPLORE_AFTER-th idle round verifies the pruned tree, so both are measured anew.
            return kept
        chosen = np.sort(kept[order])
        tree.kept[kept] = False
        tree.kept[chosen] = True
        return chosen

    def host_budget(self, budget: int, cap: float | None) -> int:
        """B_ver on this host: the configured one, shrunk to what T(n) <= cap x T(0) allows (cap None: as set)."""
        return budget if cap is None or not self.verify_cost else min(budget, self.verify_cost.largest_within(cap))

    @profiled("prune")
    def learn(self, tree: DraftTree, kept: np.ndarray, path: list[int], verify_ms: float) -> None:
        """What the cut chose taught: T(len(kept)) and the acceptance of the verified nodes."""
        self.verify_cost.observe(len(kept), verify_ms)
        self.acceptance.update(tree, kept, path)
        self.idle = self.idle + 1 if len(kept) == 0 and tree.n > 1 else 0  # learned here, so trials leave it

    def calibrate(self, target, prompt_ids: list[int], budget: int, passes: int = 2) -> None:
        """Seed T(n), once, by timing verifications of chains of the probe sizes on this prompt's prefilled
        cache (then rolled back): one warm-up, then `passes` passes over all sizes, the fastest time of each
        (interleaved passes, so a burst of other load does not bend the curve at one size). Runs before a
        generation's clock starts, like model loading."""
        if self.verify_cost or len(prompt_ids) < 2:
            return
        target.start(prompt_ids)
        last = prompt_ids[-1]
        sizes = probe_sizes(budget)
        chains = {}
        for n in sizes:
            chains[n] = DraftTree.new(last, capacity=n + 1)
            for i in range(n):
                add_child(chains[n], i, last, 0.0, SMALL, 1)
        best = {n: float("inf") for n in sizes}
        for n in [sizes[-1]] + sizes * passes:  # the first one warms up
            t0 = timed(target.device)
            target.verify(chains[n], np.arange(n + 1))
            best[n] = min(best[n], 1000 * (timed(target.device) - t0))
            target.rollback()
        for n in sizes:
            self.verify_cost.observe(n, best[n])
