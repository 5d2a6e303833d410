"""Self-speculative decoding: the target's first k layers, then its final norm and LM head, are
the draft model; no second model (Elhoushi et al. 2024, LayerSkip; Zhang et al. 2023, "Draft &
Verify")."""

from __future__ import annotations

from numbers import Integral

import numpy as np

from ..errors import MinispecError
from ..sampling import sample
from .base import Draft, Drafter


class EarlyExitDrafter(Drafter):
    """Draft with layers 0..k-1 of the target, in the target's own KV cache.

    Layers 0..k-1 compute the same keys, values and hidden states for a token whether drafting
    or verification runs them, so nothing is computed twice: `start` receives the target's KV
    cache; drafting writes layers 0..k-1 of it for each position it feeds and keeps that
    position's layer-k hidden state; `verify_forward` then runs layers 0..k-1 only for what
    drafting never fed (the last draft) and layers k..L-1 for every position. Every cache entry is
    the target's own, so the loop's rollback of the target cache rolls the drafter back too.

    Exact like every drafter: q is the warped distribution of the early-exit logits, the one
    each draft is sampled from. A head trained on the last layer reads layer k's hidden state
    poorly, so acceptance is modest unless the model was trained for it (LayerSkip's layer
    dropout and early-exit loss); a draft step costs about k/L of a target step.
    """

    name = "early-exit"

    def __init__(self, target, exit_layer: int) -> None:
        super().__init__(target)
        L = target.n_layers
        if (isinstance(exit_layer, bool) or not isinstance(exit_layer, Integral)
                or not 1 <= exit_layer < L):
            raise MinispecError(
                f"exit_layer: expected an integer in 1..{L - 1} (target "
                f"{target.name!r} has {L} layers), got {exit_layer!r}")
        self.k = int(exit_layer)
        self.cache = None  # the target's, from start
        self._pos = 0  # first position drafting fed this round
        self._fed: list[int] = []  # the tokens it fed there, in order
        self._h: list = []  # their layer-k hidden states, one [T, D] piece per draft step

    def start(self, prompt_ids, cache) -> None:
        """New generation: draft in the target's cache `cache` from now on."""
        self.cache, self.calls, self._fed, self._h = cache, 0, [], []

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Sample gamma tokens from the early exit, one call of layers 0..k-1 each; the first
        also feeds what the target cache lacks (the last context token; the prompt at first)."""
        target, cache = self.target, self.cache
        pos = cache.length  # the target cache holds context[:pos] in every layer
        tokens = list(context[pos:])
        gamma = max(min(gamma, cache.max_len - len(context) + 1), 0)  # feeds < len + gamma - 1
        self._pos, self._fed, self._h = pos, [], []
        drafts = np.empty(gamma, dtype=np.int64)
        q = np.empty((gamma, self.vocab_size))
        for i in range(gamma):
            h = target.run_layers(target.embed(tokens, pos), cache, pos, 0, self.k)  # [T, D]
            self.calls += 1
            self._fed += tokens
            self._h.append(h)
            q[i] = warp(target.head(h[-1:])[0])  # [V]: only the row we sample from
            drafts[i] = sample(q[i], rng)
            pos, tokens = pos + len(tokens), [int(drafts[i])]
        return Draft(drafts, q)

    def verify_forward(self, tokens, cache, n_logits):
        """The target's forward over `tokens`, reusing layers 0..k-1 of the positions drafting
        fed: their keys and values are already in the cache and their layer-k hidden states were
        kept; anything else is computed here, so the logits are the target's whatever was drafted.
        """
        target = self.target
        tokens = [int(t) for t in tokens]
        pos, n = cache.length, len(self._fed)
        reuse = cache is self.cache and pos == self._pos and tokens[:n] == self._fed
        parts, n = (self._h, n) if reuse and n else ([], 0)
        if n < len(tokens):  # layers 0..k-1 for what drafting never fed
            h = target.embed(tokens[n:], pos + n)  # [T - n, D]
            parts = parts + [target.run_layers(h, cache, pos + n, 0, self.k)]
        h = parts[0] if len(parts) == 1 else target.xp.concatenate(parts)  # -> [T, D]
        h = target.run_layers(h, cache, pos, self.k, target.n_layers)  # [T, D]
        cache.length = pos + len(tokens)
        self._fed, self._h = [], []
        return target.head(h[-n_logits:]), h  # [n_logits, V], [T, D]


def default_exit_layer(target) -> int:
    """The early-exit drafter's default k: a quarter of the target's layers, at least 1."""
    return max(1, target.n_layers // 4)
