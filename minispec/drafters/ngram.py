"""Prompt lookup: draft by copying from the context (Saxena 2023, "Prompt Lookup Decoding";
Leviathan et al. 2023 mention n-gram drafters in section 2.3). No model, no cache."""

from __future__ import annotations

from numbers import Integral

import numpy as np

from ..core.drafter import Draft, Drafter
from ..errors import MinispecError


class NgramDrafter(Drafter):
    """Find the most recent earlier occurrence of the context's last n tokens, trying n = max_n
    down to 1 (the longest suffix that recurs wins), and propose the up to gamma tokens that
    followed it. The copy may run on into the tokens it is producing, like an LZ77 copy, so a
    repeat shorter than gamma (`a b a b`, `x x x`) still fills gamma drafts. No earlier
    occurrence: no drafts, and the round is one plain target step.

    The drafts are a function of the context, so each q row is one-hot. verify() then accepts a
    draft x with probability p(x) (r * 1 < p(x)), and on rejection samples norm(max(0, p -
    onehot(x))): p with x removed, renormalized. Exact, like every drafter.
    """

    name = "ngram"

    def __init__(self, target, max_n: int = 3) -> None:
        super().__init__(target)
        if isinstance(max_n, bool) or not isinstance(max_n, Integral) or max_n < 1:
            raise MinispecError(f"NgramDrafter: max_n must be an integer >= 1, got {max_n!r}")
        self.max_n = int(max_n)

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Copy up to gamma tokens from after the latest earlier match of the context's suffix
        (0 tokens without a match); q one-hot. warp and rng are not needed."""
        ctx = np.asarray(context, dtype=np.int64)
        start = find_ngram(ctx, self.max_n) if gamma > 0 else -1
        drafts = copy_from(ctx, start, gamma, self.vocab_size) if start >= 0 else []
        return Draft(np.array(drafts, dtype=np.int64), one_hot(drafts, self.vocab_size))


def copy_from(context: np.ndarray, start: int, count: int, vocab_size: int) -> list[int]:
    """Up to `count` tokens copied from context[start:], running on into the copied tokens past
    the end (an LZ77 copy); stopped early at an id outside the sampled vocabulary (a prompt may
    hold one)."""
    drafts: list[int] = []
    for j in range(start, start + count):
        x = int(context[j]) if j < len(context) else drafts[j - len(context)]
        if x >= vocab_size:
            break
        drafts.append(x)
    return drafts


def one_hot(tokens: list[int], vocab_size: int) -> np.ndarray:
    """q of tokens that are a function of the context: row i puts all its mass on tokens[i]."""
    q = np.zeros((len(tokens), vocab_size))  # [g, V]
    q[np.arange(len(tokens)), tokens] = 1.0
    return q


def find_ngram(context: np.ndarray, max_n: int, min_n: int = 1) -> int:
    """Where to copy from: the index just past the most recent earlier occurrence of the last n
    tokens of `context` (int array [S]), for the largest n in min_n..max_n that has one; -1 if
    none.

    "Earlier" means ending before the last token (the suffix itself does not count); occurrences
    may overlap it (in `x x x` the suffix `x x` also occurs at 0, so the answer is 2).
    """
    ends = find_ngrams(context, max_n, min_n)
    return int(ends[-1]) if ends.size else -1


def find_ngrams(context: np.ndarray, max_n: int, min_n: int = 1) -> np.ndarray:
    """Every place find_ngram could copy from, oldest first: the indices just past each earlier
    occurrence of the last n tokens of `context`, for the largest n in min_n..max_n that has
    one (int array; empty if none)."""
    s, top = len(context), min(max_n, len(context) - 1)  # the longest suffix to look up
    found = np.zeros(0, dtype=np.int64)
    if top < 1:
        return found
    # ends: the last index of each earlier occurrence of the last n tokens, for n = 1, 2, ...
    # in turn; an occurrence of n + 1 tokens is one of n that also matches one token further back
    ends = np.flatnonzero(context[:-1] == context[-1])
    for n in range(1, top + 1):
        if n > 1:
            ends = ends[ends >= n - 1]
            ends = ends[context[ends - (n - 1)] == context[s - n]]
        if ends.size == 0:
            break
        if n >= min_n:
            found = ends + 1
    return found
