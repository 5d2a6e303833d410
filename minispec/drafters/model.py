"""Draft with a second, smaller model: M_q in Leviathan et al. 2023 (section 2.3)."""

from __future__ import annotations

import copy

import numpy as np

from ..batched import batch_head, batch_hidden
from ..errors import MinispecError
from ..sampling import sample
from .base import BatchDrafting, Draft, Drafter, check_vocabularies


class ModelDrafter(Drafter):
    """Draft with a smaller model sharing the target's tokenizer (vocabularies checked here).

    Its KV cache holds a prefix of the context: after a round it is rolled back to the tokens the
    target kept, and the next `propose` feeds whatever it has not seen yet (the correction or
    bonus token, plus the last draft when every draft was accepted) in one multi-token call.
    """

    name = "model"

    def __init__(self, target, model) -> None:
        super().__init__(target)
        check_vocabularies(target, model)
        self.model = model
        self.cache = None
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last draft)

    def start(self, prompt_ids, cache) -> None:
        """New generation: an empty cache (allocated once, reused by later generations)."""
        if max(prompt_ids) >= self.model.vocab_size:
            raise MinispecError(
                f"prompt_ids: token id {max(prompt_ids)} is outside the vocabulary of draft "
                f"{self.model.name!r} (0..{self.model.vocab_size - 1})")
        if self.cache is None:
            self.cache = self.model.new_cache()
        self.cache.rollback(0)
        self.calls, self._synced, self._fed = 0, 0, []

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Sample gamma tokens from the draft model, one forward call each; the first call also
        feeds the context tokens the cache has not seen. The last draft is not fed: nothing
        needs its logits this round."""
        gamma, tokens = self.prepare(context, gamma)
        if gamma == 0:
            return self.empty_draft()
        drafts = np.empty(gamma, dtype=np.int64)
        q = np.empty((gamma, self.vocab_size))
        for i in range(gamma):
            logits = self.model.forward(tokens, self.cache)  # [T, V_draft]
            self.calls += 1
            q[i] = warp(logits[-1])  # [V]: only the row we sample from
            drafts[i] = sample(q[i], rng)
            tokens = [int(drafts[i])]
        self.drafted(context, drafts)
        return Draft(drafts, q)

    def prepare(self, context, gamma) -> tuple[int, list[int]]:
        """Before drafting: how many drafts fit (gamma, or fewer near the draft's context limit;
        0 when nothing can be drafted) and the tokens the first draft call feeds (the context
        the cache has not seen). Grows the cache when the context outgrows it."""
        model = self.model
        # the cache will hold context + drafts[:-1]; near the draft's own context limit, draft less
        gamma = min(gamma, model.config.max_position_embeddings - len(context) + 1)
        tokens = context[self.cache.length:]  # catch-up: tokens accepted since the last round
        if gamma < 1 or (tokens and max(tokens) >= model.vocab_size):
            # nothing to draft, or the target sampled an id past this model's vocabulary (only
            # possible without tokenizers): the round is one target step
            self._synced, self._fed = self.cache.length, []
            return 0, []
        if len(context) + gamma - 1 > self.cache.max_len:  # grow (rare): re-read the context
            self.cache = model.new_cache(
                min(model.config.max_position_embeddings, 2 * (len(context) + gamma)))
            tokens = context
        return gamma, tokens

    def drafted(self, context, drafts) -> None:
        """After drafting: remember what the cache now holds past the context."""
        self._synced, self._fed = len(context), drafts[:-1].tolist()

    def for_batch(self) -> BatchModelDrafting:
        return BatchModelDrafting(self)

    def accept(self, context, hidden) -> None:
        """Roll the cache back to the drafts the target kept (the rest of `context` is caught up
        on in the next `propose`)."""
        n = self._synced
        for d in self._fed:
            if n == len(context) or context[n] != d:
                break
            n += 1
        # keep at least the last context token unseen: the next propose feeds it to get logits
        # (a sampler whose correction repeats the rejected draft would otherwise leave nothing)
        self.cache.rollback(min(n, len(context) - 1))


class BatchModelDrafting(BatchDrafting):
    """The draft model serving a batch: each draft step is one call of the draft model for
    every sequence still drafting (minispec/batched.py), each sequence with its own draft cache;
    the bookkeeping per sequence is ModelDrafter's own."""

    def start(self, slot, prompt_ids, cache) -> None:
        d = copy.copy(self.drafter)
        d.cache = None  # its own cache, not the one the drafter it was copied from holds
        d.start(prompt_ids, cache)
        self.slots[slot] = d

    def propose(self, slots, contexts, gammas, warp, rngs) -> list[Draft]:
        ds = [self.slots[s] for s in slots]
        plans = [d.prepare(c, g) for d, c, g in zip(ds, contexts, gammas)]  # (gamma, tokens)
        drafts = [np.empty(g, dtype=np.int64) for g, _ in plans]
        qs = [np.empty((g, self.vocab_size)) for g, _ in plans]
        feed = [tokens for _, tokens in plans]
        for i in range(max((g for g, _ in plans), default=0)):
            live = [b for b, (g, _) in enumerate(plans) if g > i]  # still drafting
            hs = batch_hidden(self.drafter.model, [feed[b] for b in live],
                              [ds[b].cache for b in live])
            logits = batch_head(self.drafter.model, hs, [1] * len(live))  # [1, V_draft] each
            for b, row in zip(live, logits):
                ds[b].calls += 1
                qs[b][i] = warp(row[0])
                drafts[b][i] = sample(qs[b][i], rngs[b])
                feed[b] = [int(drafts[b][i])]
        out = []
        for d, c, (g, _), tokens, q in zip(ds, contexts, plans, drafts, qs):
            if g == 0:
                out.append(d.empty_draft())
                continue
            d.drafted(c, tokens)
            out.append(Draft(tokens, q))
        return out
