"""The target: prefill, one tree-masked verification forward, KV compaction (SPEC 3).

The target's cache always holds every committed token but the last; the last one
is the tree's root, fed at the head of each verification so that its output is
the distribution of the first new token.
"""
from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from .kv import additive_mask, keep_slots
from .profile import profiled
from .tree import DraftTree, batch_layout


class TargetModel:
    """`keep_features`: also keep the final normed hidden states of the last forward (`features`), which a
    draft-head mid reads (treegraft/drafters/head.py); the logits are then the head module applied to them."""

    def __init__(self, model, keep_features: bool = False):
        self.model = model
        self.keep_features = keep_features
        self.device = model.get_input_embeddings().weight.device
        self.dtype = next(model.parameters()).dtype
        self.features: torch.Tensor | None = None  # [n, H] of the last forward (keep_features only)
        self.cache = DynamicCache()
        self.cached = 0

    @profiled("target_forward")
    def forward(self, ids: torch.Tensor, **kw) -> torch.Tensor:
        """[1, n] ids -> [n, vocab] logits (the stock forward)."""
        if not self.keep_features:
            return self.model(input_ids=ids, cache=self.cache, use_cache=True, **kw).logits[0]
        self.features = self.model.model(input_ids=ids, cache=self.cache, use_cache=True, **kw).last_hidden_state[0]
        return self.model.get_output_embeddings()(self.features)

    @torch.no_grad()
    def start(self, committed: list[int]) -> None:
        """Prefill every committed token but the last (features [L - 1, H] kept for a draft head)."""
        self.cache, self.cached = DynamicCache(), 0
        self.features = torch.zeros(0, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
        if len(committed) > 1:
            ids = torch.tensor([committed[:-1]], device=self.device)
            if self.keep_features:
                self.features = self.model.model(input_ids=ids, cache=self.cache, use_cache=True).last_hidden_state[0]
            else:
                self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
            self.cached = len(committed) - 1

    @torch.no_grad()
    def decode_one(self, token: int) -> torch.Tensor:
        """Plain autoregressive step (no custom mask): [vocab] logits of the token after `token`."""
        logits = self.forward(torch.tensor([[token]], device=self.device))  # [1, vocab]
        self.cached += 1
        return logits[-1]

    @torch.no_grad()
    def verify(self, tree: DraftTree, nodes: np.ndarray) -> torch.Tensor:
        """One forward over root + kept nodes (index order): [n, vocab] target logits at each node."""
        ids, mask, positions = self._layout(tree, nodes)
        return self.forward(ids, attention_mask=mask, position_ids=positions)

    @profiled("mask")
    def _layout(self, tree: DraftTree, nodes: np.ndarray):
        """ids [1, n], additive mask [1, 1, n, L + n] (prefix + own ancestors), positions [1, n]."""
        anc, depth = batch_layout(tree, nodes)
        n, L = len(nodes), self.cached
        visible = np.concatenate([np.ones((n, L), dtype=bool), anc], axis=1)  # [n, L + n]
        ids = torch.from_numpy(tree.token[nodes])[None].to(self.device)  # [1, n]
        positions = torch.from_numpy(L + depth)[None].to(self.device)  # root sits at L = len(committed) - 1
        return ids, additive_mask(visible, self.dtype, self.device), positions

    def rollback(self) -> None:
        """Drop whatever a verification appended (the cache holds the committed prefix again)."""
        keep_slots(self.cache, torch.arange(self.cached, device=self.device))

    def accepted_features(self, rows: list[int]) -> torch.Tensor | None:
        """[len(rows), H] the last verification's features at the accepted rows (None unless kept)."""
        return self.features[rows] if self.keep_features else None

    @profiled("kv")
    def commit(self, rows: list[int]) -> None:
        """Keep the prefix and the accepted rows (root first) of the last verification."""
        keep = torch.cat([torch.arange(self.cached), self.cached + torch.tensor(rows, dtype=torch.long)])
        keep_slots(self.cache, keep.to(self.device))
        self.cached += len(rows)
