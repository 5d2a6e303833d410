"""Self-speculative decoding: the target's first k layers, then its final norm and LM head, are
the draft model; no second model (Elhoushi et al. 2024, LayerSkip; Zhang et al. 2023, "Draft &
Verify")."""

from __future__ import annotations

from numbers import Integral

import numpy as np

from ..batch_forward import batch_embed, batch_head, batch_run_layers, split
from ..core.drafter import Draft, Drafter
from ..core.sampling import sample
from ..errors import MinispecError


class EarlyExitDrafter(Drafter):
    """Draft with layers 0..k-1 of the target, in the target's own KV cache.

    Layers 0..k-1 compute the same keys, values and hidden states for a token whether drafting
    or verification runs them, so nothing is computed twice: `start` receives the target's KV
    cache; drafting writes layers 0..k-1 of it for each position it feeds and keeps that
    position's layer-k hidden state; `target_forward` then runs layers 0..k-1 only for what
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
        self.exit_layer = int(exit_layer)  # k: layers 0..k-1 draft
        self.target_cache = None  # the target's KV cache, from start: drafting writes into it
        self._pos = 0  # first position drafting fed this round
        self._fed: list[int] = []  # the tokens it fed there, in order
        self._h: list = []  # their layer-k hidden states, one [T, D] piece per draft step

    def start(self, prompt_ids, cache) -> None:
        """New generation: draft in the target's cache `cache` from now on."""
        self.target_cache, self.calls, self._pos, self._fed, self._h = cache, 0, 0, [], []

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Sample gamma tokens from the early exit, one call of layers 0..k-1 each (see
        propose_batch: this is the batch of one)."""
        return self.propose_batch([self], [context], [gamma], warp, [rng])[0]

    def propose_batch(self, drafters, contexts, gammas, warp, rngs) -> list[Draft]:
        """Each sequence's chain of drafts, one call of layers 0..k-1 per step for every
        sequence still drafting (minispec/batch_forward.py). The first call also feeds what a target
        cache lacks (the last context token; the prompt at first)."""
        target, k = self.target, self.exit_layer
        feed, gs = [], []
        for d, c, g in zip(drafters, contexts, gammas):
            d._pos, d._fed, d._h = d.target_cache.length, [], []  # it holds c[:pos], all layers
            feed.append(list(c[d.target_cache.length:]))
            gs.append(max(min(g, d.target_cache.max_len - len(c) + 1), 0))  # feeds < len + g - 1
        drafts = [np.empty(g, dtype=np.int64) for g in gs]
        qs = [np.empty((g, self.vocab_size)) for g in gs]
        for i in range(max(gs, default=0)):
            live = [b for b, g in enumerate(gs) if g > i]
            starts = [drafters[b]._pos + len(drafters[b]._fed) for b in live]
            sizes = [len(feed[b]) for b in live]
            h = batch_embed(target, [feed[b] for b in live], starts)  # [N, D]
            h = self.run_layers(h, [drafters[b].target_cache for b in live], starts, sizes, 0,
                                k)  # [N, D]: layer k's hidden states
            hs = split(h, sizes)
            probs = batch_head(target, hs, [1] * len(live), warp)  # [1, V] each, warped
            for b, hb, row in zip(live, hs, probs):
                d = drafters[b]
                d.calls += 1
                d._fed += feed[b]
                d._h.append(hb)
                qs[b][i] = row[0]  # [V]: only the row we sample from
                drafts[b][i] = sample(qs[b][i], rngs[b])
                feed[b] = [int(drafts[b][i])]
        return [Draft(t, q) for t, q in zip(drafts, qs)]

    def target_forward(self, unseen, draft, cache):
        """The target's forward over unseen + drafts, reusing layers 0..k-1 of the positions
        drafting fed (see target_forward_batch: this is the batch of one)."""
        return self.target_forward_batch([self], [unseen], [draft], [cache])[0]

    def target_forward_batch(self, drafters, unseen_lists, drafts, caches) -> list:
        """The target's forward for each sequence, reusing layers 0..k-1 of the positions
        drafting fed: their keys and values are already in the cache and their layer-k hidden
        states were kept; anything else is computed here, every sequence in one call of layers
        0..k-1 and one of layers k..L-1, so the result is the target's whatever was drafted."""
        target, k = self.target, self.exit_layer
        tokens = [[int(x) for x in p] + t.tokens.tolist() for p, t in zip(unseen_lists, drafts)]
        starts = [c.length for c in caches]
        reused = [d.reusable(ts, c) for d, ts, c in zip(drafters, tokens, caches)]
        rest = [b for b, ((_, n), ts) in enumerate(zip(reused, tokens)) if n < len(ts)]
        fresh = {}
        if rest:  # layers 0..k-1 for what drafting never fed, every such sequence in one call
            r_tokens = [tokens[b][reused[b][1]:] for b in rest]
            r_starts = [starts[b] + reused[b][1] for b in rest]
            r_sizes = [len(t) for t in r_tokens]
            h = batch_embed(target, r_tokens, r_starts)  # [N', D]
            h = self.run_layers(h, [caches[b] for b in rest], r_starts, r_sizes, 0, k)
            fresh = dict(zip(rest, split(h, r_sizes)))
        parts = [reused[b][0] + ([fresh[b]] if b in fresh else []) for b in range(len(tokens))]
        h = target.xp.concatenate([p for ps in parts for p in ps])  # [N, D]
        sizes = [len(ts) for ts in tokens]
        h = self.run_layers(h, caches, starts, sizes, k, target.n_layers)  # [N, D]
        for d, c, p in zip(drafters, caches, unseen_lists):
            c.length += len(p)  # the context; the drafts' entries wait after it
            d._fed, d._h = [], []
        return split(h, sizes)

    def run_layers(self, h, caches, starts: list[int], sizes: list[int], first: int, end: int):
        """The target's layers first..end-1 for a batch of sequences (batch_run_layers): every
        layer computation of this drafter goes through here."""
        return batch_run_layers(self.target, h, caches, starts, sizes, first, end)

    def reusable(self, tokens: list[int], cache) -> tuple[list, int]:
        """The layer-k hidden states drafting kept for the first n of `tokens`, and n (0 when
        this round's drafting fed something else)."""
        n = len(self._fed)
        if (n and cache is self.target_cache and cache.length == self._pos
                and tokens[:n] == self._fed):
            return self._h, n
        return [], 0

    def draft_step(self):
        """What one draft step runs, for timing: the target's first k layers and its head."""
        return self.target, self.exit_layer


def default_exit_layer(target) -> int:
    """The early-exit drafter's default k: a quarter of the target's layers, at least 1."""
    return max(1, target.n_layers // 4)
