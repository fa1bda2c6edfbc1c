"""Lossless acceptance of a verified tree (SPEC 3): greedy walks the target's argmax, sampling draws.

Greedy: at each node take the target's argmax and descend into the child carrying it.
Sampling: at each node draw y from the target's processed distribution and descend into
the child carrying y. Siblings carry distinct tokens and drafts are deterministic, so
this is exactly sampling from the target.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import GenerationConfig
from .profile import profiled
from .sampling import draw, processed_probs
from .target import TreeLogits
from .tree import DraftTree


@dataclass
class Acceptance:
    path: list[int]  # accepted nodes, root first
    rows: list[int]  # their rows in the verification batch
    bonus: int  # the token the target emits after the last accepted node

    @property
    def accepted_tokens(self) -> int:
        return len(self.path) - 1


def _walk(tree: DraftTree, nodes: np.ndarray, choose) -> Acceptance:
    row = {int(v): i for i, v in enumerate(nodes)}
    v, path, rows = 0, [0], [0]
    while True:
        y = choose(row[v])
        c = tree.child_of.get((v, y))
        if c is None or not tree.kept[c]:
            return Acceptance(path, rows, y)
        v = c
        path.append(v)
        rows.append(row[v])


def next_token(logits: torch.Tensor, gen: GenerationConfig, generator: torch.Generator | None) -> int:
    """The target's token after one row of logits [vocab]: its argmax, or a draw when sampling."""
    if gen.greedy:
        return int(logits.argmax())
    return draw(processed_probs(logits[None], gen)[0], generator)


@profiled("accept")
def accept(tree: DraftTree, nodes: np.ndarray, logits: TreeLogits, gen: GenerationConfig,
           generator: torch.Generator | None) -> Acceptance:
    """Walk root + kept nodes (index order), reading the target's logits only at the rows the walk reaches."""
    if gen.greedy and logits.all is not None:  # every row computed already: one argmax call, one device sync
        best = logits.all.argmax(-1).tolist()  # [n]
        return _walk(tree, nodes, lambda r: best[r])
    return _walk(tree, nodes, lambda r: next_token(logits.row(r), gen, generator))
