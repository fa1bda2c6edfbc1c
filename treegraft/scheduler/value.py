"""Offline value system f_theta, feature selection by grouped CV, margin labels and g_psi (SPEC 5).

Dataset rows come from `collect`: for each sampled round, all 2^D schedules tau were
drafted and verified from the same state, recording A, t = t_D + t_V and the candidate
features z_k at every step. f_theta maps (z_k, a_k, tau_{k+1:D}) to (A, t); the margin
of a state is max_tau eta_hat(z, 1, tau) - max_tau eta_hat(z, 0, tau) with eta = (A + 1) / t by
default: the paper's A / t ignores the bonus token every round commits, and on a pair whose mid
raises A from ~0 to ~0.5 at a cost it rewards calls that lower real throughput (measured: see README);
`bonus=0` restores the paper's definition;
g_psi (17-64-32-1 ReLU, z-scored in and out) regresses it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .features import TREE_CANDIDATES


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@dataclass
class Norm:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> "Norm":
        return cls(x.mean(0), x.std(0) + 1e-6)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.std

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return y * self.std + self.mean


def train_regressor(x: np.ndarray, y: np.ndarray, hidden: list[int], epochs: int, seed: int = 0,
                    lr: float = 3e-3) -> tuple[nn.Sequential, Norm, Norm]:
    """Full-batch Adam on z-scored inputs and targets; returns (net, x_norm, y_norm)."""
    torch.manual_seed(seed)
    xn, yn = Norm.fit(x), Norm.fit(y)
    xt = torch.from_numpy(xn(x).astype(np.float32))
    yt = torch.from_numpy(yn(y).astype(np.float32))
    net = mlp([x.shape[1], *hidden, y.shape[1]])
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-5)
    for _ in range(epochs):
        opt.zero_grad()
        loss = ((net(xt) - yt) ** 2).mean()
        loss.backward()
        opt.step()
    return net.eval(), xn, yn


def predict(net: nn.Sequential, xn: Norm, yn: Norm, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = net(torch.from_numpy(xn(x).astype(np.float32))).numpy()
    return yn.inverse(out)


# --- the dataset ---------------------------------------------------------------------------------

@dataclass
class StepRows:
    """One row per (trajectory, step k)."""

    tree: np.ndarray  # [rows, n_candidates] tree features, TREE_CANDIDATES order
    ctx: np.ndarray  # [rows, n_ctx] context/history features
    action: np.ndarray  # [rows] a_k
    future: np.ndarray  # [rows, D] tau_j for j > k, else 0
    k: np.ndarray  # [rows] 1..D
    state: np.ndarray  # [rows] canonical state id: (round, k, tau_{1:k-1})
    group: np.ndarray  # [rows] prompt id (CV groups)
    A: np.ndarray  # [rows] accepted tokens of the trajectory
    t: np.ndarray  # [rows] t_D + t_V (ms) of the trajectory


def step_rows(records: list[dict], depth: int) -> StepRows:
    cols: dict[str, list] = {k: [] for k in StepRows.__dataclass_fields__}
    states: dict[tuple, int] = {}
    n_tree = len(TREE_CANDIDATES)
    for rec in records:
        for traj in rec["trajectories"]:
            tau = traj["schedule"]
            for k in range(1, depth + 1):
                feats = traj["features"][k - 1]
                key = (rec.get("profile"), rec["prompt_id"], rec["round"], k, tuple(tau[: k - 1]))
                cols["tree"].append(feats[:n_tree])
                cols["ctx"].append(feats[n_tree:])
                cols["action"].append(tau[k - 1])
                cols["future"].append([tau[j] if j >= k else 0 for j in range(depth)])
                cols["k"].append(k)
                cols["state"].append(states.setdefault(key, len(states)))
                cols["group"].append(rec["prompt_id"])
                cols["A"].append(traj["A"])
                cols["t"].append(1000 * (traj["t_draft"] + traj["t_verify"]))
    arr = {k: np.array(v) for k, v in cols.items()}
    return StepRows(**{k: arr[k].astype(np.float32) if k in ("tree", "ctx", "future", "A", "t") else arr[k]
                       for k in arr})


def value_inputs(rows: StepRows, tree_idx: list[int]) -> np.ndarray:
    return np.concatenate([rows.tree[:, tree_idx], rows.ctx, rows.action[:, None], rows.future], axis=1)


def grouped_folds(groups: np.ndarray, n_folds: int = 5, seed: int = 0) -> list[np.ndarray]:
    uniq = np.unique(groups)
    rng = np.random.default_rng(seed)
    rng.shuffle(uniq)
    return [np.isin(groups, part) for part in np.array_split(uniq, n_folds)]


def cv_error(rows: StepRows, tree_idx: list[int], hidden=(32, 32), epochs=120, n_folds=5) -> float:
    """Held-out error of f_theta (mean squared error of z-scored A and t), folds grouped by prompt."""
    x = value_inputs(rows, tree_idx)
    y = np.stack([rows.A, rows.t], 1)
    errs = []
    for test in grouped_folds(rows.group, n_folds):
        if test.all() or not test.any():
            continue
        net, xn, yn = train_regressor(x[~test], y[~test], list(hidden), epochs)
        pred = predict(net, xn, yn, x[test])
        errs.append(float((((pred - y[test]) / yn.std) ** 2).mean()))
    return float(np.mean(errs))


MIN_GAIN = 0.01  # forward selection stops when the best addition lowers the held-out error by less than 1%


def select_features(rows: StepRows, n_keep: int = 6, candidates: list[str] | None = None, log=print,
                    min_gain: float = MIN_GAIN) -> tuple[list[str], list[tuple[str, float]]]:
    """Greedy forward selection of tree features by grouped 5-fold CV; returns (selection, table).

    Adds the feature that lowers the held-out error most, and stops when that lowers it by less than
    `min_gain` (relative) or at `n_keep` features: a feature that does not help on held-out prompts is not
    kept. The table lists every step tried, the rejected last one included."""
    chosen: list[int] = []
    table = [("(context only)", cv_error(rows, []))]
    log(f"  {'(context only)':60s} cv_mse={table[0][1]:.4f}")
    remaining = [TREE_CANDIDATES.index(c) for c in (candidates or TREE_CANDIDATES)]
    best_err = table[0][1]
    while len(chosen) < n_keep and remaining:
        err, best = min((cv_error(rows, chosen + [c]), c) for c in remaining)
        name = "+".join(TREE_CANDIDATES[i] for i in chosen + [best])
        table.append((name, err))
        if err > best_err * (1 - min_gain):
            log(f"  {name:60s} cv_mse={err:.4f}  (gain < {100 * min_gain:.0f}%: stop)")
            break
        log(f"  {name:60s} cv_mse={err:.4f}")
        chosen.append(best)
        remaining.remove(best)
        best_err = err
    return [TREE_CANDIDATES[i] for i in chosen], table


def heldout_sign_agreement(z: np.ndarray, margin: np.ndarray, groups: np.ndarray, hidden: list[int],
                           epochs: int, seed: int = 0) -> float:
    """g_psi's sign agreement with the margin labels on held-out prompts (5 folds grouped by prompt)."""
    hits, total = 0, 0
    for test in grouped_folds(groups, 5, seed):
        if test.all() or not test.any():
            continue
        g, gx, gy = train_regressor(z[~test], margin[~test, None], hidden, epochs, seed)
        pred = predict(g, gx, gy, z[test])[:, 0]
        hits += int(((pred > 0) == (margin[test] > 0)).sum())
        total += int(test.sum())
    return hits / max(1, total)


def futures(n: int) -> np.ndarray:
    """[2^n, n] every binary future of n steps (one empty row for n = 0)."""
    return np.array(list(itertools.product([0, 1], repeat=n)), dtype=np.float32).reshape(2 ** n, n)


def eta_from(pred: np.ndarray, bonus: float, t_floor: float = 1e-3) -> np.ndarray:
    """Throughput from [.., 2] predictions (A, t): (A + bonus) / t. bonus = 0 is the paper's eta = A / t;
    bonus = 1 counts the token every round commits anyway, i.e. real tokens per unit time. Predicted times
    are floored at t_floor: a regressor's near-zero t would otherwise give absurd throughputs."""
    return (np.clip(pred[..., 0], 0, None) + bonus) / np.clip(pred[..., 1], t_floor, None)


def eta_hat(net, xn, yn, z: np.ndarray, k: int, action: int, depth: int, bonus: float = 1.0) -> np.ndarray:
    """max over futures of eta_hat for states z [m, dz] at step k taking `action`: [m]."""
    fut = futures(depth - k)  # [f, D - k]
    m, f = len(z), len(fut)
    future = np.zeros((m * f, depth), dtype=np.float32)
    future[:, k:] = np.tile(fut, (m, 1))
    x = np.concatenate([np.repeat(z, f, 0), np.full((m * f, 1), action, np.float32), future], 1)
    t_floor = 0.25 * float(yn.mean[1])  # a quarter of the mean round time seen in training
    return eta_from(predict(net, xn, yn, x), bonus, t_floor).reshape(m, f).max(1)


def canonical(rows: StepRows) -> np.ndarray:
    """Index of each canonical state's first row."""
    return np.unique(rows.state, return_index=True)[1]


def margin_labels(rows: StepRows, tree_idx: list[int], net, xn, yn, depth: int,
                  bonus: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(z*, y) for each canonical state: y = (max_tau eta_hat(z*, 1, tau) - max_tau eta_hat(z*, 0, tau)) /
    max_tau eta_hat(z*, 0, tau): the paper's margin, relative to the throughput of not calling, so margins of
    hosts with other costs (re-timed rounds, costs.py) share one scale. Its sign is the paper's."""
    first = canonical(rows)
    z = np.concatenate([rows.tree[first][:, tree_idx], rows.ctx[first]], 1)
    ks = rows.k[first]
    y = np.zeros(len(first), dtype=np.float32)
    for k in np.unique(ks):
        sel = ks == k
        e0 = eta_hat(net, xn, yn, z[sel], int(k), 0, depth, bonus)
        y[sel] = (eta_hat(net, xn, yn, z[sel], int(k), 1, depth, bonus) - e0) / np.maximum(e0, 1e-9)
    return z, y


def decision_threshold(pred: np.ndarray, margin: np.ndarray) -> float:
    """tau >= 0 for "call the mid when g_psi(z) > tau": the cut that maximises the summed true margin of the
    states where the mid is called. On a pair where the mid rarely pays, g_psi's false positives near zero
    cost real time; tau removes them (tau = 0 when no cut does better: the paper's rule). Where almost no
    label clears g_psi's own fitting error, tau is at least that error, so noise in g_psi never calls the mid."""
    cuts = np.concatenate([[0.0], np.sort(pred[pred > 0])])  # [m]
    gains = np.array([margin[pred > c].sum() for c in cuts])
    noise = float(np.std(pred - margin))  # g_psi's fitting error: margins below it are not told apart from 0
    return max(float(cuts[int(np.argmax(gains))]), noise if (margin > noise).mean() < 0.01 else 0.0)
