"""The small drafter's second source: the target's own earlier answers (SuffixDecoding's global store).

SuffixDecoding (SPEC 2.4's welcome suffix structures) drafts from two places:
the request's own context, and the outputs the model wrote for earlier requests.
The second is what helps where the context holds nothing to copy (chat, math):
a small model's answers reuse their own phrasing ("Here's a", "```python",
"In summary,"). `CorpusIndex` is that store, read-only and shared by every
session: a corpus of token documents (the target's answers to prompts that are
never the bench's, `treegraft corpus`), indexed once at load, training-free.

Layout (flat numpy arrays, no per-gram Python objects): for each order
n = 1..n_max, every n-gram of a document that has a follower is packed exactly
into one uint64 key (n tokens of `bits` bits each, so n_max <= 64 // bits: 3
for a 128-152k vocabulary, 4 for SmolLM2's 49k). The (key, follower) pairs are
counted and sorted by key, then by count; each key keeps its top MAX_FOLLOWERS
followers and the total count of all of them, so p = count / total as in the
context index. A look-up is one binary search per order; results are memoised,
since the store never changes.
"""
from __future__ import annotations

import bisect
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from .ngram import BACKOFF

MAX_FOLLOWERS = 8  # followers kept per n-gram (the drafter asks for K <= this in practice)


class CorpusError(ValueError):
    """A corpus file that is missing, unreadable or does not fit the pair's vocabulary."""


class CorpusIndex:
    """The read-only n-gram store of a token corpus; `propose(seq, k)` as the context index's look-up."""

    def __init__(self, docs: list[np.ndarray], vocab_size: int, n_max: int = 4):
        self.bits = max(1, int(vocab_size - 1).bit_length())
        self.n_max = max(1, min(n_max, 64 // self.bits))
        self.vocab_size = vocab_size
        self.docs = len(docs)
        self.tokens = int(sum(len(d) for d in docs))
        flat = np.concatenate([np.append(np.asarray(d, dtype=np.int64), -1) for d in docs]) if docs else \
            np.zeros(0, np.int64)  # [N] documents, each followed by a -1 separator
        if flat.size and (flat.max() >= vocab_size or (flat[flat != -1] < 0).any()):
            raise CorpusError(f"corpus token ids outside the vocabulary [0, {vocab_size})")
        # per order n: (keys [G] sorted and unique, start [G + 1] into the next two, followers [F], counts [F],
        # total [G] = every follower's count of that n-gram, kept or not)
        self.orders: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = [None]
        for n in range(1, self.n_max + 1):
            self.orders.append(self._build(flat, n))
        # the keys as Python ints, searched with `bisect` (a look-up misses the memo for most new sequences, and
        # np.searchsorted on a scalar costs ~4 us an order against ~0.7 us: docs/tuning.md)
        self.key_lists: list[list[int]] = [[]] + [o[0].tolist() for o in self.orders[1:]]
        self.propose = lru_cache(maxsize=1 << 16)(self._propose)

    def _build(self, flat: np.ndarray, n: int):
        m = flat.size - n  # n-grams flat[i:i+n] with a follower flat[i+n]
        if m <= 0:
            e = np.zeros(0, np.int64)
            return np.zeros(0, np.uint64), np.zeros(1, np.int64), e, e, e
        key = np.zeros(m, np.uint64)
        ok = flat[n:n + m] >= 0  # [m] the follower is a token
        for j in range(n):
            col = flat[j:j + m]
            ok &= col >= 0
            key = (key << np.uint64(self.bits)) | np.maximum(col, 0).astype(np.uint64)
        key, foll = key[ok], flat[n:n + m][ok]
        order = np.lexsort((foll, key))
        key, foll = key[order], foll[order]
        new_pair = np.ones(key.size, bool)
        new_pair[1:] = (key[1:] != key[:-1]) | (foll[1:] != foll[:-1])
        starts = np.flatnonzero(new_pair)
        pkey, pfoll = key[starts], foll[starts]  # one row per (key, follower)
        pcount = np.diff(np.append(starts, key.size))
        # within a key: by count, descending (lexsort's last key is primary)
        order = np.lexsort((-pcount, pkey))
        pkey, pfoll, pcount = pkey[order], pfoll[order], pcount[order]
        first = np.ones(pkey.size, bool)
        first[1:] = pkey[1:] != pkey[:-1]
        gstart = np.flatnonzero(first)
        keys = pkey[gstart]
        total = np.add.reduceat(pcount, gstart)
        rank = np.arange(pkey.size) - np.repeat(gstart, np.diff(np.append(gstart, pkey.size)))
        keep = rank < MAX_FOLLOWERS
        kept_per_key = np.add.reduceat(keep.astype(np.int64), gstart)
        start = np.concatenate([[0], np.cumsum(kept_per_key)])
        return keys, start, pfoll[keep], pcount[keep], total

    def _key(self, gram: tuple[int, ...]) -> int:
        k = 0
        for t in gram:
            k = (k << self.bits) | t
        return k

    def _propose(self, seq: tuple[int, ...], k: int) -> tuple[tuple[tuple[int, float], ...], int]:
        """(up to k (token, p) best first for what follows `seq`, the order of the longest matching suffix; 0:
        none). The longest matching suffix decides; shorter ones fill in, scaled as the context index does."""
        out: list[tuple[int, float]] = []
        seen: set[int] = set()
        longest, scale = 0, 1.0
        for n in range(min(self.n_max, len(seq)), 0, -1):
            keys = self.key_lists[n]
            key = self._key(seq[-n:])
            g = bisect.bisect_left(keys, key)
            if g == len(keys) or keys[g] != key:
                continue
            _, start, foll, count, total = self.orders[n]
            longest = longest or n
            tot = float(total[g])
            lo, hi = start[g:g + 2].tolist()
            for tok, c in zip(foll[lo:hi].tolist(), count[lo:hi].tolist()):
                if tok not in seen:
                    out.append((tok, scale * c / tot))
                    seen.add(tok)
                    if len(out) == k:
                        return tuple(out), longest
            scale *= BACKOFF
        return tuple(out), longest

    def describe(self) -> dict:
        return {"documents": self.docs, "tokens": self.tokens, "n_max": self.n_max,
                "ngrams": [int(o[0].size) for o in self.orders[1:]]}


def save_corpus(path: Path, docs: list[list[int]], meta: dict) -> None:
    """Documents as one uint32 array + offsets (compressed .npz), with a JSON description."""
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    flat = np.array([t for d in docs for t in d], dtype=np.uint32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, tokens=flat, lengths=lengths, meta=np.array(json.dumps(meta)))


def load_corpus(path: Path | str | list[Path], vocab_size: int, n_max: int) -> CorpusIndex:
    """The index of a saved corpus, or of several read as one store; a clear error for a missing or broken file."""
    docs = []
    for one in ([path] if isinstance(path, (str, Path)) else path):
        docs += _corpus_docs(Path(one))
    return CorpusIndex(docs, vocab_size, n_max)


def _corpus_docs(path: Path) -> list[np.ndarray]:
    if not path.exists():
        raise CorpusError(f"corpus file {path} not found (models.yaml `corpus:`; make it with "
                          f"`python -m treegraft corpus`, or remove the line)")
    try:
        with np.load(path, allow_pickle=False) as z:
            flat, lengths = z["tokens"].astype(np.int64), z["lengths"]
    except Exception as err:  # noqa: BLE001 -- any unreadable file gets the same clear message
        raise CorpusError(f"corpus file {path} is not a TreeGraft corpus (.npz with tokens, lengths): {err}") from err
    if lengths.sum() != flat.size or (lengths < 0).any():
        raise CorpusError(f"corpus file {path}: lengths do not add up to its {flat.size} tokens")
    return np.split(flat, np.cumsum(lengths)[:-1]) if lengths.size else []
