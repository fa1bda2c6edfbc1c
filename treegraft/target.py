"""The target: prefill, one tree-masked verification forward, KV compaction (SPEC 3).

The target's cache always holds every committed token but the last; the last one
is the tree's root, fed at the head of each verification so that its output is
the distribution of the first new token.

Logits only where acceptance needs them (`lazy`). A verification runs the decoder
over root + kept nodes, but acceptance reads the logits of the rows it walks: the
root, then each accepted node, A + 1 rows of n. On a CPU the output head (vocab x
hidden, the model's largest matrix) costs about as much per row as a whole decoder
layer stack does for the few rows of a tree, so a lazy verification computes the
root's row in the forward and every further row when acceptance reaches it
(`TreeLogits.row`): the same per-row products, so greedy output is unchanged. On a
GPU the head over all rows is as cheap as over one, and one batched call is kept.

A lazy verification may also name its likely rows (`lead`: rows the acceptance will
probably read, most likely first): the forward computes them with the root's row
in one batched head call, which on a CPU costs a fraction of a row computed alone
(the head's weights are read once for all of them; `Pruner.lead_rows` decides by the
measured head cost). Any other row is still computed when first read.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .kv import GrowingCache, additive_mask, keep_slots, timed
from .profile import profiled
from .tree import DraftTree, batch_layout

LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")  # configs that change logits


class TreeLogits:
    """The target's logits at the rows of one forward: all computed (eager), or the first row and then each row
    when it is first read (lazy)."""

    def __init__(self, features: torch.Tensor, head, lazy: bool, lead: list[int] | None = None):
        self.features, self.head = features, head  # [n, H]; features -> logits
        self.computed: dict[int, torch.Tensor] = {}  # row -> [vocab]
        self.all = None if lazy else head(features)  # [n, vocab]
        self.first = 0  # rows computed in the forward (lazy)
        if lazy:
            rows = [0] + [r for r in dict.fromkeys(lead or []) if 0 < r < len(features)]
            self.computed = dict(zip(rows, head(features[rows])))  # one call: root + the likely rows
            self.first = len(rows)

    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def extra_rows(self) -> int:
        """Rows computed after the forward (lazy: one per accepted token read off the lead)."""
        return max(len(self.computed) - self.first, 0)

    def row(self, i: int) -> torch.Tensor:
        """[vocab] logits at row i (-1: the last row)."""
        i = i % len(self)
        if self.all is not None:
            return self.all[i]
        if i not in self.computed:
            self.computed[i] = self._compute(i)
        return self.computed[i]

    @profiled("target_forward")
    def _compute(self, i: int) -> torch.Tensor:
        return self.head(self.features[i:i + 1])[0]


def with_taps(final: torch.Tensor, taps: list[torch.Tensor]) -> torch.Tensor:
    """[..., (1 + k) H]: the final normed feature, then each tapped layer's output RMS-normalised (no weights),
    so every part has the same scale whatever the layer; the one layout training and drafting share."""
    if not taps:
        return final
    h = final.shape[-1]
    return torch.cat([final] + [F.rms_norm(t.to(final.dtype), (h,), eps=1e-6) for t in taps], dim=-1)


def final_part(feats: torch.Tensor, hidden: int) -> torch.Tensor:
    """[..., H] the final normed feature of `with_taps` features (what the output head reads)."""
    return feats[..., :hidden]


def tap_outputs(model, taps: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """The dict that forward hooks on the decoder layers `taps` fill with each forward's outputs [n, H] (batch row
    0): one hook per layer of a loaded model, however many engines read it."""
    store = model.__dict__.setdefault("_treegraft_tapped", {})
    hooked = model.__dict__.setdefault("_treegraft_hooks", set())
    for t in taps:
        if t not in hooked:
            def keep(module, args, output, t=t):
                store[t] = (output[0] if isinstance(output, tuple) else output)[0]
            model.model.layers[t].register_forward_hook(keep)
            hooked.add(t)
    return store


class TargetModel:
    """The forward runs the decoder (`model.model`) and keeps its final normed hidden states (`features`), which
    a draft-head mid reads (treegraft/drafters/head.py); logits are the output head applied to them, at every row
    or lazily (`lazy`: see the module's docstring). A model whose config post-processes its logits (soft-capping,
    scaling) runs its stock forward instead, every row eager (`keep_features` is then not available). `taps`: decoder
    layers whose outputs a tapped draft head reads too (forward hooks on those stock layers keep the last forward's
    outputs; `head_features` joins them to the final features, `with_taps`)."""

    def __init__(self, model, keep_features: bool = False, lazy: bool = False, lead_rows: bool = True,
                 taps: tuple[int, ...] = ()):
        self.model = model
        self.keep_features = keep_features
        self.taps = tuple(taps)
        self._hooked = tap_outputs(model, self.taps)  # what the hooks wrote in the model's latest forward
        self.tapped: dict[int, torch.Tensor] = {}  # tap layer -> its output [n, H] in this target's last forward
        self.head_only = not any(getattr(model.config, a, None) for a in LOGIT_POSTPROCESSING)
        if keep_features and not self.head_only:
            raise ValueError(f"{type(model).__name__} post-processes its logits: a draft head cannot read its features")
        self.lazy = lazy and self.head_only
        self.lead_rows = self.lazy and lead_rows  # a verification may name rows to compute with the root's
        self.device = model.get_input_embeddings().weight.device
        self.dtype = next(model.parameters()).dtype
        self.features: torch.Tensor | None = None  # [n, H] of the last forward
        self.cache = GrowingCache()
        self.cached = 0

    def head_features(self, rows: list[int] | None = None) -> torch.Tensor:
        """[len(rows), H (1 + len(taps))] the last forward's features at `rows` (all rows: None), with the tapped
        layers' outputs (what a draft head reads)."""
        pick = slice(None) if rows is None else rows
        return with_taps(self.features[pick], [self.tapped[t][pick] for t in self.taps])

    @profiled("target_forward")
    def forward(self, ids: torch.Tensor, lead: list[int] | None = None, **kw) -> TreeLogits:
        """[1, n] ids -> the logits at its n rows (lazy: the root's and `lead`'s computed now)."""
        if not self.head_only:
            return TreeLogits(self.model(input_ids=ids, cache=self.cache, use_cache=True, **kw).logits[0],
                              lambda x: x, lazy=False)
        self.features = self.model.model(input_ids=ids, cache=self.cache, use_cache=True, **kw).last_hidden_state[0]
        self.tapped = {t: self._hooked[t] for t in self.taps}
        return TreeLogits(self.features, self.model.get_output_embeddings(), self.lazy, lead)

    @torch.no_grad()
    def start(self, committed: list[int]) -> None:
        """Prefill every committed token but the last (features [L - 1, H] kept for a draft head)."""
        self.cache, self.cached = GrowingCache(), 0
        self.features = torch.zeros(0, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
        self.tapped = {t: self.features for t in self.taps}
        if len(committed) > 1:
            ids = torch.tensor([committed[:-1]], device=self.device)
            if self.keep_features:
                self.features = self.model.model(input_ids=ids, cache=self.cache, use_cache=True).last_hidden_state[0]
                self.tapped = {t: self._hooked[t] for t in self.taps}
            else:
                self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
            self.cached = len(committed) - 1

    @torch.no_grad()
    def decode_one(self, token: int) -> torch.Tensor:
        """Plain autoregressive step (no custom mask): [vocab] logits of the token after `token`."""
        logits = self.forward(torch.tensor([[token]], device=self.device))
        self.cached += 1
        return logits.row(-1)

    @torch.no_grad()
    def verify(self, tree: DraftTree, nodes: np.ndarray, lead: list[int] | None = None) -> TreeLogits:
        """One forward over root + kept nodes (index order): the target's logits at each node. `lead`: rows
        (positions in `nodes`) whose logits a lazy forward computes with the root's."""
        ids, mask, positions = self._layout(tree, nodes)
        return self.forward(ids, lead, attention_mask=mask, position_ids=positions)

    @torch.no_grad()
    def head_ms(self, rows: int, clock) -> float:
        """ms of the output head over `rows` rows of the last forward's features (a lazy forward's batched call)."""
        x = self.features[:1].expand(rows, -1).contiguous()
        t0 = clock()
        self.model.get_output_embeddings()(x)
        return 1000 * (clock() - t0)

    @profiled("mask")
    def _layout(self, tree: DraftTree, nodes: np.ndarray):
        """ids [1, n], additive mask [1, 1, n, L + n] (prefix + own ancestors), positions [1, n]."""
        anc, depth = batch_layout(tree, nodes)
        n, L = len(nodes), self.cached
        visible = np.concatenate([np.ones((n, L), dtype=bool), anc], axis=1)  # [n, L + n]
        ids = torch.from_numpy(tree.token[nodes])[None].to(self.device)  # [1, n]
        positions = torch.from_numpy(L + depth)[None].to(self.device)  # root sits at L = len(committed) - 1
        return ids, additive_mask(visible, self.dtype, self.device), positions

    @torch.no_grad()
    def memory_floor_ms(self, passes: int = 3) -> float:
        """The memory floor of one decoding step here: the time to read every weight of the target once (a sum
        over each parameter, best of `passes`). Measured once, then kept."""
        if getattr(self, "_floor_ms", None) is None:
            params = list(self.model.parameters())
            best = float("inf")
            for _ in range(passes + 1):  # the first pass warms up
                t0 = timed(self.device)
                for p in params:
                    p.sum()
                best = min(best, 1000 * (timed(self.device) - t0))
            self._floor_ms = best
        return self._floor_ms

    def rollback(self) -> None:
        """Drop whatever a verification appended (the cache holds the committed prefix again)."""
        keep_slots(self.cache, self.cached)

    def accepted_features(self, rows: list[int]) -> torch.Tensor | None:
        """[len(rows), H (1 + len(taps))] the last verification's features at the accepted rows (None unless kept)."""
        return self.head_features(rows) if self.keep_features else None

    @profiled("kv")
    def commit(self, rows: list[int]) -> None:
        """Keep the prefix and the accepted rows (root first) of the last verification."""
        keep_slots(self.cache, self.cached, [self.cached + r for r in rows])
        self.cached += len(rows)
