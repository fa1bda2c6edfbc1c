"""Pruning before verification (SPEC 2.3), and the cost-aware cut of the verification budget.

Three budgets, each defined once (names as in `DraftingConfig`):

- B_ver (`budget`): after all D draft steps, `prune` keeps exactly min(B_ver, nodes)
  non-root nodes, best path score first, closed under ancestors (the paper's rule).
- the cost-aware cut (`adaptive_budget`): of those, `Pruner.select` verifies only the
  n <= B_ver that pay for their verification time on this host (below). With it, B_ver
  itself follows the host (`verify_cost_cap`, default 1.6): it shrinks to the largest
  probed n whose T(n) <= cap x T(0) in the calibration's probes (like-for-like forwards,
  interleaved: not the rounds', see `Pruner.probe_cost`). Where verification is nearly flat in n
  (a GPU, a CPU with fast bf16 matrix units) trees grow to the configured 63; where each
  node costs (a 2-core AVX2 CPU in fp32: T(8) ~ 1.5 T(0)) they stay small.
- B0 (`mid_budget`): the most mid calls a round may make (the scheduler's; see
  scheduler/policy.py), not a pruning budget.

The cost-aware cut. SPEC 3 verifies the B_ver best nodes every round. On a GPU a
verification costs about the same for 1 or 63 nodes; on a CPU it does not: on the
2-core AVX2 machine a SmolLM2-135M forward takes ~50 ms for one token and ~80-100 ms
for 2-16. A tree that will probably be rejected then costs more than it can return.
So the n nodes (0 <= n <= B_ver) with the highest estimated path acceptance pi(v) are
kept, n maximising  E_n - rho (T(n) - T(0)):  the expected accepted tokens of the n
nodes, minus their extra verification time priced at rho, the tokens per ms this
engine's recent rounds reached (drafting and bookkeeping included; before any round,
plain decoding's 1 / T(0)). Pricing time at the rounds' own rate is what maximises
tokens per second (a node pays only if it beats the round it is in); priced at
1 / T(0), the cut kept every node that beat plain decoding, and verified trees about
twice the size that paid (2026-12-03: B_ver held at 7 ran 6-8% faster than the cut
at 11-15). n = 0 verifies the root alone: exactly a plain decoding step. Greedy and
sampled outputs are unchanged (acceptance is lossless for any tree, including none).

- pi(v) = prod over the path of c(u), c(u) = P(u accepted | its parent accepted),
  learned online from the engine's own verifications (`AcceptanceModel`), in bins
  of the node's own p, per proposer (small only / mid only / both). The prior of a
  bin is the drafter's own p times that proposer's pooled ratio of accepted to
  expected nodes, so a bin not yet seen starts where the drafter's record points (the
  n-gram drafter's count ratios overstate acceptance by ~1.6x on the default pair: a
  cut fed the raw p verified nodes that did not pay).
- T(n): running means of the measured verification time per node count
  (`VerifyCost`), seeded by one probe of a few sizes before the first generation's
  clock starts (`Pruner.calibrate`).

The lead rows. Where the target computes logits lazily (target.py), acceptance reads
the root's row and then one row per accepted node, each a head call of its own. The
verification instead computes the likely rows with the root's in one call
(`Pruner.lead_rows`): the kept nodes by pi(v), on any branch, while pi(v) x H(1)
(its row alone, if it is read) exceeds H(m + 1) - H(m) (one more row in the batched
call); H is the head's cost by rows, timed by the calibration beside T(n).
The cut then counts an accepted token's row at that batched cost (`token_row_ms`).
"""
from __future__ import annotations

import bisect
import copy
import math
import statistics
from collections import deque

import numpy as np
import torch

from .kv import timed
from .profile import profiled
from .tree import MID, SMALL, DraftTree, add_child

P_EDGES = np.array([0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9])  # bin upper edges of a node's own p
LOG_EDGES = np.log(P_EDGES).tolist()  # the same edges on log p (bins of `AcceptanceModel.one`)
PRIOR_STRENGTH = 4.0  # pseudo-observations of a cell at its prior (the drafter's own p, times its proposer's ratio)
RATIO_STRENGTH = 4.0  # pseudo-observations of a proposer's pooled ratio at 1 (the drafters' own p, unscaled)
DECAY = 0.995  # per round: recent rounds weigh more (the prompt's kind changes acceptance)
CHOSEN_WINDOW = 20  # recent rounds whose verified node counts size the next draft (`Pruner.draft_budget`)
RATE_DECAY = 0.9  # per round: the rounds' rate rho reads about the last ten rounds
EXPLORE_AFTER = 8  # after this many rounds in a row that verified nothing of a drafted tree, verify one whole


class AcceptanceModel:
    """c(u) = P(u accepted | parent accepted), Beta-smoothed toward a prior, in cells of (the n-gram drafter's
    own p, the mid's own q): each axis binned by P_EDGES, plus a bin for "this drafter has not scored u"
    (`tree.raw`). The prior of a cell is the more confident drafter's p times its proposer's pooled ratio
    (accepted / expected over every trial of that proposer: small only, mid only, both), so what one cell
    learns about a drafter's over- or under-confidence moves the cells not yet seen. Learned from every
    verification; it is also the map of "calibrated" scores (tree.py): `one` and `many` put both drafters
    on one scale."""

    NONE = len(P_EDGES) + 1  # the bin of a drafter that has not scored the node

    def __init__(self):
        self.hits = np.zeros((self.NONE + 1, self.NONE + 1))  # [small bin, mid bin]
        self.trials = np.zeros((self.NONE + 1, self.NONE + 1))
        self.pooled_hits = np.zeros(3)  # [proposer]: accepted trials (proposer 0 small only, 1 mid only, 2 both)
        self.pooled_expected = np.zeros(3)  # [proposer]: the drafters' own p summed over the same trials
        self._lists = None  # (hits, trials, ratio) as Python lists for `one`, rebuilt after an update

    @classmethod
    def cells(cls, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(small bin [n], mid bin [n], the drafters' own p [n]) of their own log p raw [n, 2] (NaN: not
        scored); the p is the more confident drafter's."""
        scored = ~np.isnan(raw)
        logs = np.where(scored, raw, -np.inf)  # [n, 2]
        bins = np.where(scored, np.digitize(logs, LOG_EDGES), cls.NONE)  # the bins of P_EDGES, on log p
        return bins[:, 0], bins[:, 1], np.exp(logs.max(axis=1))  # exp(-inf) = 0: scored by neither

    @classmethod
    def proposer(cls, bs, bm):
        """0 small only, 1 mid only, 2 both (scalars or arrays of bins); a node scored by neither counts as 0."""
        return np.where(bm == cls.NONE, 0, np.where(bs == cls.NONE, 1, 2))

    @property
    def ratio(self) -> np.ndarray:
        """[3] accepted / expected per proposer, shrunk toward 1 (no trials yet: the drafters' own p as they are)."""
        return (self.pooled_hits + RATIO_STRENGTH) / (self.pooled_expected + RATIO_STRENGTH)

    def of_raw(self, raw: np.ndarray) -> np.ndarray:
        """[n] c for raw log p rows [n, 2]."""
        bs, bm, p = self.cells(raw)
        prior = np.minimum(1.0, p * self.ratio[self.proposer(bs, bm)])
        return (self.hits[bs, bm] + PRIOR_STRENGTH * prior) / (self.trials[bs, bm] + PRIOR_STRENGTH)

    def many(self, raw: np.ndarray) -> np.ndarray:
        """[n] log c: the "calibrated" score (tree.py) of nodes from their drafters' own log p [n, 2]."""
        return np.log(np.maximum(self.of_raw(raw), 1e-12))

    def one(self, small: float, mid: float) -> float:
        """`many` for one node in plain Python (drafters call it per node); NaN: not scored."""
        if self._lists is None:
            self._lists = (self.hits.tolist(), self.trials.tolist(), self.ratio.tolist())
        hits, trials, ratio = self._lists
        bs = self.NONE if small != small else bisect.bisect_right(LOG_EDGES, small)  # = np.digitize on p
        bm = self.NONE if mid != mid else bisect.bisect_right(LOG_EDGES, mid)
        best = max(x for x in (small, mid, -math.inf) if x == x)
        who = 0 if bm == self.NONE else 1 if bs == self.NONE else 2  # = proposer()
        prior = min(1.0, math.exp(best) * ratio[who]) if best > -math.inf else 0.0
        c = (hits[bs][bm] + PRIOR_STRENGTH * prior) / (trials[bs][bm] + PRIOR_STRENGTH)
        return math.log(max(c, 1e-12))

    def conditional(self, tree: DraftTree, nodes: np.ndarray, without: int | None = None) -> np.ndarray:
        """[n] c(u) for nodes; `without`: as if that drafter (SMALL or MID) had not scored them."""
        raw = tree.raw[nodes]
        if without is not None:
            raw = raw.copy()
            raw[:, without] = np.nan
        return self.of_raw(raw)

    def path_acceptance(self, tree: DraftTree, nodes: np.ndarray, without: int | None = None) -> np.ndarray:
        """[n] pi(v) for an ancestor-closed node set in index order (parents first). A tree scored by this
        record (calibrated scores) already holds it: pi(v) = s(v). `without`: as `conditional` (the yield gate's
        counterfactual reads the n-gram nodes without the head's scores, `Pruner.cut_among`)."""
        if tree.calibration is self and without is None:
            return np.exp(tree.score[nodes])
        c = self.conditional(tree, nodes, without)
        pi = np.ones(tree.n)
        for v, cv in zip(nodes.tolist(), c.tolist()):
            pi[v] = pi[tree.parent[v]] * cv
        return pi[nodes]

    def update(self, tree: DraftTree, nodes: np.ndarray, path: list[int]) -> None:
        """Learn from one verification: every verified node whose parent was accepted is one trial."""
        for table in (self.hits, self.trials, self.pooled_hits, self.pooled_expected):
            table *= DECAY
        on_path = np.zeros(tree.n, dtype=bool)
        on_path[path] = True
        tried = nodes[on_path[tree.parent[nodes]]]
        bs, bm, p = self.cells(tree.raw[tried])
        hit = on_path[tried].astype(float)
        np.add.at(self.trials, (bs, bm), 1.0)
        np.add.at(self.hits, (bs, bm), hit)
        who = self.proposer(bs, bm)
        np.add.at(self.pooled_hits, who, hit)
        np.add.at(self.pooled_expected, who, p)
        self._lists = None


WINDOW = 9  # recent timings kept per node count: the curve reads their median


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to y in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for yi, wi in zip(y.tolist(), w.tolist()):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(c, m) for m, _, c in blocks]) if blocks else np.zeros(0)


class VerifyCost:
    """T(n): verification wall time (ms) for n non-root nodes, robust to load.

    Each measured n keeps its last WINDOW timings (calibration probes and committed rounds alike); the
    curve is the weighted isotonic (non-decreasing) fit of their medians, so one slow probe or a burst
    of other load moves it little, and a noisy sample can never make more nodes look cheaper."""

    def __init__(self):
        self.samples: dict[int, deque] = {}
        self._fit: dict[int, float] | None = None  # the curve, fitted once per new sample

    def __bool__(self) -> bool:
        return 0 in self.samples and len(self.samples) > 1

    def observe(self, n: int, ms: float) -> None:
        self.samples.setdefault(int(n), deque(maxlen=WINDOW)).append(float(ms))
        self._fit = None

    @property
    def ms(self) -> dict[int, float]:
        """{n: fitted T(n)} at every measured n."""
        if self._fit is None:
            keys = sorted(self.samples)
            med = np.array([statistics.median(self.samples[k]) for k in keys])  # (numpy's: ~15 us a call)
            fit = isotonic(med, np.array([len(self.samples[k]) for k in keys], dtype=float))
            self._fit = {k: float(t) for k, t in zip(keys, fit)}
        return self._fit

    @ms.setter
    def ms(self, table: dict[int, float]) -> None:
        self.samples, self._fit = {}, None
        for n, t in table.items():
            self.observe(n, t)

    def largest_within(self, cap: float) -> int:
        """The largest measured n with T(n) <= cap x T(0) (at least 1)."""
        curve = self.ms
        return int(max([1] + [n for n, t in curve.items() if t <= cap * curve[0]]))

    def growth(self, n: int = 8) -> float:
        """log T(n) / T(0): how fast verification cost grows with the tree here (0 before calibration)."""
        return float(np.log(self(np.array([n]))[0] / self.ms[0])) if self else 0.0

    def __call__(self, n: np.ndarray) -> np.ndarray:
        """T at n, interpolated on the monotone fit."""
        curve = self.ms
        return np.interp(n, list(curve), list(curve.values()))


HEAD_ROWS = (1, 2, 4, 8, 16)  # head call sizes the calibration times (root + lead rows)


def probe_sizes(budget: int) -> list[int]:
    """The node counts the calibration measures, below B_ver, and B_ver: 0, 1, 3, 5, 7, 11, 15, 23, 31, 47, ...
    (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ... tokens with the root), half-octave steps from 4 tokens up. B_ver moves
    between these buckets, so the half steps let it follow the curve where T(2^k) is just over the cap and
    T(1.5 x 2^k) is not: on a 2-core Zen 4 EPYC in fp32, T(12) read 1.45 T(1) where T(16) read 1.76."""
    tokens = sorted({1 << i for i in range(11)} | {3 << i for i in range(1, 10)})  # 1, 2, 4, 6, 8, 12, ...
    return [t - 1 for t in tokens if t - 1 < budget] + [budget]


def probe_chain(token: int, n: int) -> DraftTree:
    """A calibration probe: the root then a chain of n nodes, every one `token` (a verification's cost depends on its
    size, not on what it verifies)."""
    chain = DraftTree.new(token, capacity=n + 1)
    for i in range(n):
        add_child(chain, i, token, 0.0, SMALL, 1)
    return chain


def choose(pi: np.ndarray, cost: VerifyCost, row_ms: float = 0.0,
           rate: float | None = None) -> tuple[np.ndarray, float]:
    """(order of the chosen nodes, best n's gain): the top-n nodes by pi maximising
    E_n (1 - rate row_ms) - rate (T(n) - T(0)), in tokens; row_ms: what each accepted token adds to the round (its
    logits row, computed lazily; 0 where the head runs over every row in the forward). rate: the tokens per ms
    this engine's rounds reach (`Pruner.rate`), the price of the time a node costs; None: 1 / T(0), plain decoding's
    rate (a node then pays when it beats decoding its token alone; at the rounds' own rate, when it beats the
    round it is in, which is the rule that maximises tokens per second)."""
    order = np.lexsort((np.arange(len(pi)), -pi))  # ties: index order keeps parents first
    n = np.arange(len(pi) + 1)
    expected = np.concatenate([[0.0], np.cumsum(pi[order])])  # [n + 1] E_n
    t = cost(n)
    rate = 1.0 / t[0] if rate is None else rate
    gain = expected * (1 - rate * row_ms) - rate * (t - t[0])
    best = int(np.argmax(gain))
    return order[:best], float(gain[best])


def keepable(tree: DraftTree, budget: int) -> np.ndarray:
    """[tree.n] bool: the nodes `prune(tree, budget)` would keep now (root included), best path score first,
    closed under ancestors; the tree is not changed."""
    live = tree.live()[1:]
    target = min(budget, len(live))
    kept = np.zeros(tree.n, dtype=bool)
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
    return kept


def prune(tree: DraftTree, budget: int) -> np.ndarray:
    """Keep exactly min(budget, live non-root nodes) nodes, best path score first, closed under ancestors.

    Returns the kept non-root nodes in index order and sets `tree.kept` (the root is always kept).
    """
    kept = keepable(tree, budget)
    tree.kept[: tree.n] = kept
    return np.flatnonzero(kept)[1:]


def expandable(tree: DraftTree, pool: np.ndarray) -> np.ndarray:
    """The pool nodes a draft step may expand (`DraftingConfig.expand` = "keepable"): those the prune to
    `tree.keep_budget` (this round's B_ver on this host, sized to what the cut verifies: `Pruner.draft_budget`)
    could still keep. A node outside that set has children scoring no higher than itself, so they would be cut
    before verification: expanding it costs drafting time (a mid forward row each) for nothing. keep_budget None:
    the whole pool (the paper's rule)."""
    if tree.keep_budget is None or len(pool) == 0:
        return pool
    return pool[keepable(tree, tree.keep_budget)[pool]]


def bucket_of(n: int, sizes: list[int]) -> int:
    """Index of the largest probe size <= n (B_ver moves between these buckets)."""
    return max(i for i, b in enumerate(sizes) if b <= max(n, sizes[0]))


class Pruner:
    """B_ver, then the cost-aware cut; learns T(n) and the acceptance model from each verification.

    B_ver on this host (`host_b`) is set by the calibration's probes (`probe_cost`: medians of interleaved
    passes, so one slow probe moves it at most one bucket; see tests/test_cost_model.py). The rounds
    refine T(n) (`verify_cost`) for the cut, not B_ver: a round's forward runs after its drafting, not back to
    back with the other sizes, and only at the sizes the cut chose, so a ratio over the refined fit compares
    unlike timings (on a Zen 5 host, six all-small generations raised T(16) 25.1 -> 29.4 ms and moved B_ver
    23 -> 15 with nothing else on the host)."""

    def __init__(self):
        self.acceptance = AcceptanceModel()  # learned across generations
        self.verify_cost = VerifyCost()  # T(n): the calibration's probes, refined by every verified round (the cut)
        self.probe_cost = VerifyCost()  # T(n): the calibration's probes alone (B_ver)
        self.head_cost = VerifyCost()  # H: the output head's ms by rows - 1 (lazy targets; calibrated once)
        self.row_ms = 0.0  # the head over one more row (a lazily computed accepted row): running mean
        self.host_b: int | None = None  # B_ver on this host, once measured
        self.threads: int | None = None  # the torch thread count the calibration chose
        self.idle = 0  # committed rounds in a row that verified none of their drafted nodes
        self.round_tokens = 0.0  # decayed sums over committed rounds: tokens committed, and the rounds' ms
        self.round_ms = 0.0
        self.chosen: deque = deque(maxlen=CHOSEN_WINDOW)  # nodes the cut verified in the recent rounds (inf: all)
        self._cut: float = math.inf  # the last select's verified count where the cut left nodes out (inf: none)

    HOST_FIELDS = ("verify_cost", "probe_cost", "head_cost", "row_ms", "host_b", "threads")  # the target's costs here
    # ... and the rounds' rate rho, and what the cut priced on these chose (the recent verified counts that size the
    # drafting, the idle rounds): every field a clock set
    TIMED_FIELDS = HOST_FIELDS + ("round_tokens", "round_ms", "chosen", "idle")

    def share_host(self, other: "Pruner") -> None:
        """Take `other`'s measurements of the target's costs on this host (T(n), the head's H, a row's ms, B_ver,
        the thread count), keeping this pruner's acceptance model: engines that run the same target here then cut
        and verify alike, so a side-by-side run compares their drafters, not two calibrations' luck."""
        self._take(other, self.HOST_FIELDS)

    def take_timings(self, other: "Pruner") -> None:
        """Take every field `other` learned from a clock (its host costs, the rounds' rate rho, the cut's recent
        choices), keeping this pruner's acceptance model: what rounds timed under other load taught is undone,
        what they accepted is kept."""
        self._take(other, self.TIMED_FIELDS)

    def _take(self, other: "Pruner", names: tuple[str, ...]) -> None:
        for name in names:
            setattr(self, name, copy.deepcopy(getattr(other, name)))

    def draft_budget(self, b: int) -> int:
        """The B_ver a draft step sizes itself to (`expandable`): the probe bucket just above what the cut verified
        in 90% of the recent rounds, at most b (B_ver on this host). Drafting a tree of B_ver nodes where the cut
        verifies a third of them costs the n-gram and tree bookkeeping (1 ms a round here) for nodes that are cut;
        the bucket above leaves room for the cut to ask for more, and a round where the cut kept every node the
        prune left counts as asking for all (before 5 rounds: b)."""
        if len(self.chosen) < 5:
            return b
        q = float(np.percentile(self.chosen, 90, method="higher"))  # inf where the cut left out nothing that often
        return min(b, next((n for n in probe_sizes(b) if n > q), b))

    @property
    def rate(self) -> float | None:
        """rho: tokens per ms of the recent committed rounds (None before the first)."""
        return self.round_tokens / self.round_ms if self.round_ms > 0 else None

    @profiled("prune")
    def select(self, tree: DraftTree, budget: int, adaptive: bool, cap: float | None = None) -> np.ndarray:
        """The kept non-root nodes (index order; tree.kept updated). Uncalibrated: the pruned tree."""
        if not adaptive or not self.verify_cost:
            return prune(tree, budget)
        kept = prune(tree, self.host_budget(budget, cap))
        order = self.cut(self.acceptance.path_acceptance(tree, kept))
        if len(order) == 0 and self.idle >= EXPLORE_AFTER - 1:
            # Exploration: T(n) and the acceptance model learn only from what is verified, so one noisy
            # calibration (T(1) measured far above T(0)) could make the cut verify nothing ever again.
            # Every EXPLORE_AFTER-th idle round verifies the pruned tree, so both are measured anew.
            return kept
        chosen = np.sort(kept[order])
        self._cut = len(chosen) if len(chosen) < len(kept) else math.inf
        tree.kept[kept] = False
        tree.kept[chosen] = True
        return chosen

    def cut(self, pi: np.ndarray) -> np.ndarray:
        """The cost-aware cut of nodes with path acceptance pi [n]: the order of the chosen ones (`choose` at this
        host's T(n), an accepted token's row and the rounds' rate)."""
        return choose(pi, self.verify_cost, self.token_row_ms(), self.rate)[0]

    def cut_among(self, tree: DraftTree, nodes: np.ndarray, budget: int, adaptive: bool,
                  cap: float | None = None) -> np.ndarray:
        """The nodes `select` would verify had the tree held only `nodes` (ancestor-closed, index order), each scored
        by the n-gram drafter alone (its own log p through the acceptance record, the mid's column ignored): what
        an all-small round would have verified, the yield gate's counterfactual of a call round
        (scheduler/online.py). The tree is not changed."""
        if len(nodes) == 0:
            return nodes
        pi = self.acceptance.path_acceptance(tree, nodes, without=MID)  # [n]
        b = self.host_budget(budget, cap) if adaptive else budget
        top = np.lexsort((nodes, -pi))[:b]  # the prune: best pi first (ancestors first: c <= 1, ties by index)
        if not adaptive or not self.verify_cost:
            return np.sort(nodes[top])
        return np.sort(nodes[top][self.cut(pi[top])])

    def token_row_ms(self) -> float:
        """What an accepted token adds to a round for its logits row (the cut's row_ms): one more row of the lead's
        batched head call, (H(4) - H(1)) / 3, where the head's cost is measured; else a lazily computed row's mean."""
        if self.head_cost:
            one, four = self.head_cost(np.array([0, 3]))
            return float(four - one) / 3
        return self.row_ms

    @profiled("prune")
    def lead_rows(self, tree: DraftTree, nodes: np.ndarray, rule: str = "nodes") -> list[int]:
        """Rows (positions in root + kept `nodes`) that a lazy verification computes with the root's row (module
        docstring): the kept nodes the acceptance walk will likely read, most likely first, while a node's chance of
        being read (its path acceptance pi: the walk reads a node's row exactly when it accepts the node) times a
        row computed alone beats what one more row adds to the batched call, pi x H(1) > H(m+1) - H(m).
        rule "nodes": any kept node may join, so where two branches compete (the n-gram drafter's and the head's
        under the root) the less likely one's rows are no longer computed alone when it wins (pi falls along a
        path, so a node's ancestors join before it); "path": one path from the root, the likeliest child at each
        node (the rule until 2026-12-04). [] before the head's cost is measured."""
        if not self.head_cost or len(nodes) < 2:
            return []
        pi = self.acceptance.path_acceptance(tree, nodes[1:])  # [n - 1], row j + 1 of nodes
        if rule == "path":
            best: dict[int, int] = {}  # node -> its likeliest kept child's index j
            for j, v in enumerate(nodes[1:].tolist()):
                u = int(tree.parent[v])
                if u not in best or pi[j] > pi[best[u]]:
                    best[u] = j
            order, u = [], 0
            while u in best:
                order.append(best[u])
                u = int(nodes[best[u] + 1])
        else:
            order = np.argsort(-pi, kind="stable").tolist()
        curve = self.head_cost.ms
        keys = sorted(curve)
        last = (curve[keys[-1]] - curve[keys[-2]]) / (keys[-1] - keys[-2])  # per row past the largest call timed
        alone = curve[0]
        lead: list[int] = []
        for j in order:
            m = len(lead) + 1  # rows - 1 of the call with this node in it
            more, now = self.head_cost(np.array([m, m - 1])) if m <= keys[-1] else (last, 0.0)
            if pi[j] * alone <= more - now:
                break
            lead.append(j + 1)
        return lead

    def host_budget(self, budget: int, cap: float | None) -> int:
        """B_ver on this host: the configured one, shrunk to what T(n) <= cap x T(0) allows (cap None: as set)."""
        if cap is None or not self.verify_cost:
            return budget
        return min(budget, self.host_b if self.host_b is not None else self.curve_budget(budget, cap))

    def curve_budget(self, budget: int, cap: float) -> int:
        """What the probes' curve alone allows (the refined one where nothing was probed), snapped down to a
        probe bucket."""
        sizes, curve = probe_sizes(budget), self.probe_cost or self.verify_cost
        return sizes[bucket_of(min(budget, curve.largest_within(cap)), sizes)]

    def update_host_budget(self, budget: int, cap: float | None) -> None:
        """Move host_b one probe bucket toward what the curve now allows (set it outright the first time; after a
        calibration only the probes set it, so this moves it only where no calibration ran)."""
        if cap is None or not self.verify_cost:
            return
        sizes, want = probe_sizes(budget), self.curve_budget(budget, cap)
        if self.host_b is None:
            self.host_b = want
            return
        i, j = bucket_of(self.host_b, sizes), bucket_of(want, sizes)
        self.host_b = sizes[i + int(np.sign(j - i))]

    @profiled("prune")
    def learn(self, tree: DraftTree, kept: np.ndarray, path: list[int], verify_ms: float, row_ms: float | None,
              budget: int, cap: float | None, round_ms: float | None = None) -> None:
        """What the cut chose taught: T(len(kept)) (the forward's own time), the cost of one more head row, the
        acceptance of the verified nodes, B_ver (only where no calibration probed the curve), and (given the round's
        ms) the rounds' rate rho:
        len(path) tokens committed (the accepted nodes and the bonus token)."""
        self.verify_cost.observe(len(kept), verify_ms)
        self.chosen.append(self._cut)
        self._cut = math.inf
        if round_ms is not None:
            self.round_tokens = RATE_DECAY * self.round_tokens + len(path)
            self.round_ms = RATE_DECAY * self.round_ms + round_ms
        if row_ms is not None:
            self.row_ms = row_ms if self.row_ms == 0.0 else 0.9 * self.row_ms + 0.1 * row_ms
        self.acceptance.update(tree, kept, path)
        self.idle = self.idle + 1 if len(kept) == 0 and tree.n > 1 else 0  # learned here, so trials leave it
        if not self.probe_cost:  # no calibration to read B_ver from: the rounds' curve is all there is
            self.update_host_budget(budget, cap)

    def calibrate(self, target, prompt_ids: list[int], budget: int, cap: float | None = None, passes: int = 3,
                  clock=None, threads: list[int] | None = None) -> None:
        """Seed T(n), once, by timing verifications of chains of the probe sizes on this prompt's prefilled
        cache (then rolled back): one warm-up, then `passes` interleaved passes over all sizes, every timing
        kept (the curve reads their median, so one slow probe or a burst of other load does not bend it).
        `threads`: candidate torch thread counts, probed in the same interleaved passes; the count whose median
        times summed over the sizes is lowest is kept for the whole process (`torch.set_num_threads`; on a
        host shared with a busy process, one thread can beat two by 1.5-2x) and its timings seed T(n).
        A target that computes lead rows has its head timed too, over HEAD_ROWS rows in the same way (H, for
        `lead_rows`). Runs before a generation's clock starts, like model loading. `clock`: seconds (a test
        scripts it)."""
        if self.verify_cost or len(prompt_ids) < 2:
            return
        clock = clock or (lambda: timed(target.device))
        threads = threads or [torch.get_num_threads()]
        target.start(prompt_ids)
        last = prompt_ids[-1]
        sizes = probe_sizes(budget)
        chains = {n: probe_chain(last, n) for n in sizes}
        timings = {th: {n: [] for n in sizes} for th in threads}
        plan = [(threads[0], sizes[-1], False)] + [(th, n, True) for _ in range(passes) for th in threads for n in sizes]
        for th, n, keep in plan:  # the first one warms up
            torch.set_num_threads(th)
            t0 = clock()
            target.verify(chains[n], np.arange(n + 1))
            if keep:
                timings[th][n].append(1000 * (clock() - t0))
            target.rollback()
        best = min(threads, key=lambda th: sum(np.median(ts) for ts in timings[th].values()))
        torch.set_num_threads(best)
        self.threads = best
        for n, ts in timings[best].items():
            for ms in ts:
                self.verify_cost.observe(n, ms)
                self.probe_cost.observe(n, ms)
        if getattr(target, "lead_rows", False):  # H(rows): the head's batched calls (the root + lead rows)
            for i, rows in enumerate([HEAD_ROWS[-1]] + list(HEAD_ROWS) * passes):  # the first one warms up
                ms = target.head_ms(rows, clock)
                if i:
                    self.head_cost.observe(rows - 1, ms)
        self.update_host_budget(budget, cap)
