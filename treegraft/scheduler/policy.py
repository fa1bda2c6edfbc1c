"""The online policies built from a trained scheduler file: `treegraft` (g_psi margin) and `oracle`.

A scheduler file is JSON (no pickle): the selected tree features, the context
features, g_psi and f_theta as plain weight lists with their normalisations, and
the hardware and timings it was trained on. g_psi runs in numpy: 3,265 multiply-adds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..methods import Decision, Policy, StepState
from ..tree import MID, SMALL
from .features import FeatureTracker, context_positions


@dataclass
class NumpyMLP:
    layers: list[tuple[np.ndarray, np.ndarray]]  # (W [out, in], b [out])
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray
    x_lo: np.ndarray | None = None  # inputs are clipped to the range seen in training (no extrapolation)
    x_hi: np.ndarray | None = None
    folded: list = field(init=False, repr=False, compare=False)  # what __call__ runs: read from the above at
    # construction (a changed weight needs a new NumpyMLP)

    @classmethod
    def from_torch(cls, net, xn, yn) -> "NumpyMLP":
        lin = [m for m in net if hasattr(m, "weight")]
        return cls([(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in lin],
                   xn.mean, xn.std, yn.mean, yn.std)

    @classmethod
    def from_json(cls, d: dict) -> "NumpyMLP":
        return cls([(np.array(w, np.float32), np.array(b, np.float32)) for w, b in d["layers"]],
                   *(np.array(d[k], np.float32) for k in ("x_mean", "x_std", "y_mean", "y_std")),
                   *(np.array(d[k], np.float32) if d.get(k) is not None else None for k in ("x_lo", "x_hi")))

    def to_json(self) -> dict:
        arrays = ("x_mean", "x_std", "y_mean", "y_std", "x_lo", "x_hi")
        return {"layers": [(w.tolist(), b.tolist()) for w, b in self.layers],
                **{k: None if getattr(self, k) is None else np.asarray(getattr(self, k)).tolist() for k in arrays}}

    def clip_to(self, x: np.ndarray) -> "NumpyMLP":
        """Remember the training inputs' range: out-of-range inputs are clipped into it."""
        self.x_lo, self.x_hi = x.min(0).astype(np.float32), x.max(0).astype(np.float32)
        return self

    @property
    def n_params(self) -> int:
        return sum(w.size + b.size for w, b in self.layers)

    def __post_init__(self):
        """Fold the input and output normalisations into the first and last layers (W^T [in, out], b [out],
        float32): the same function in fewer array operations (the online scheduler evaluates it before every
        draft step, and numpy's cost there is per operation, not per multiply-add)."""
        w = [np.asarray(w, np.float64) for w, _ in self.layers]
        b = [np.asarray(b, np.float64) for _, b in self.layers]
        std, mean = np.asarray(self.x_std, np.float64), np.asarray(self.x_mean, np.float64)
        b[0] = b[0] - w[0] @ (mean / std)
        w[0] = w[0] / std
        y_std, y_mean = np.asarray(self.y_std, np.float64), np.asarray(self.y_mean, np.float64)
        w[-1], b[-1] = w[-1] * y_std[:, None], b[-1] * y_std + y_mean
        self.folded = [(wi.T.astype(np.float32).copy(), bi.astype(np.float32)) for wi, bi in zip(w, b)]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[rows, in] -> [rows, out]."""
        if self.x_lo is not None:
            x = np.minimum(np.maximum(x, self.x_lo), self.x_hi)
        h = x
        for wt, b in self.folded[:-1]:
            h = np.maximum(h @ wt + b, 0)
        wt, b = self.folded[-1]
        return h @ wt + b


@dataclass
class SchedulerFile:
    depth: int
    tree_features: list[str]
    g: NumpyMLP
    value: NumpyMLP
    meta: dict
    threshold: float = 0.0  # tau: call the mid when g_psi(z) > tau (value.decision_threshold)

    @property
    def context_features(self) -> list[str] | None:
        """The context inputs g_psi reads, in order (None: all of `context_names`)."""
        return self.meta.get("context_features")

    @classmethod
    def load(cls, path: str | Path) -> "SchedulerFile":
        d = json.loads(Path(path).read_text())
        return cls(d["depth"], d["tree_features"], NumpyMLP.from_json(d["g"]), NumpyMLP.from_json(d["value"]),
                   d.get("meta", {}), float(d.get("threshold", 0.0)))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"version": 1, "depth": self.depth, "tree_features": self.tree_features,
                                          "g": self.g.to_json(), "value": self.value.to_json(),
                                          "threshold": self.threshold, "meta": self.meta}))


def with_timings(st: StepState, sched: SchedulerFile) -> StepState:
    """Before anything was measured in this process, use the timings the scheduler was trained with."""
    t = sched.meta.get("timings", {})
    if st.t_target_ms == 0.0:
        st.t_target_ms = float(t.get("t_target_ms", 0.0))
    if st.t_mid_ms == 0.0:
        st.t_mid_ms = float(t.get("t_mid_ms", 0.0))
    if st.verify_growth == 0.0:
        st.verify_growth = float(t.get("verify_growth", 0.0))
    return st


class LearnedPolicy(Policy):
    """TreeGraft's online scheduler: call the mid when g_psi(z) > tau, within B0 mid calls per round.

    The reported margin is g_psi(z) - tau, so "margin > 0" means "call the mid" everywhere (tau = 0 is the
    paper's rule; training raises it only where that removes false positives that cost time)."""

    name = "treegraft"
    calls_every_round = False  # it calls the mid where that pays: the prompt is fed at its first call

    def __init__(self, sched: SchedulerFile, width: int, top_k: int, budget_b0: int | None = None):
        self.sched, self.b0 = sched, budget_b0
        self.tracker = FeatureTracker(width, top_k)
        self.ctx_at = context_positions(sched.depth, sched.context_features)

    def start_round(self) -> None:
        self.tracker.start_round()

    def decide(self, st: StepState) -> Decision:
        z = self.tracker.vector(with_timings(st, self.sched), self.sched.tree_features, self.ctx_at)
        margin = float(self.sched.g(z[None])[0, 0]) - self.sched.threshold
        within = self.b0 is None or sum(st.actions) < self.b0
        return Decision(MID if margin > 0 and within else SMALL, margin, z.tolist(), "g_psi")


class OraclePolicy(Policy):
    """Search every future with f_theta at each step (SPEC 4: the paper finds this collapses)."""

    name = "oracle"
    calls_every_round = False

    def __init__(self, sched: SchedulerFile, width: int, top_k: int):
        self.sched = sched
        self.tracker = FeatureTracker(width, top_k)
        self.ctx_at = context_positions(sched.depth, sched.context_features)

    def start_round(self) -> None:
        self.tracker.start_round()

    def decide(self, st: StepState) -> Decision:
        from .value import eta_from, futures

        z = self.tracker.vector(with_timings(st, self.sched), self.sched.tree_features, self.ctx_at)
        d, k = st.depth, st.k
        fut = futures(d - k)
        best = []
        for a in (0, 1):
            future = np.zeros((len(fut), d), np.float32)
            future[:, k:] = fut
            x = np.concatenate([np.repeat(z[None], len(fut), 0), np.full((len(fut), 1), a, np.float32), future], 1)
            best.append(float(eta_from(self.sched.value(x), self.sched.meta.get("eta_bonus", 1.0)).max()))
        margin = best[1] - best[0]
        return Decision(MID if margin > 0 else SMALL, margin, z.tolist(), "f_theta")
