"""Draft with a second, smaller model: M_q in Leviathan et al. 2023 (section 2.3)."""

from __future__ import annotations

import numpy as np

from ..batched import batch_head, batch_hidden
from ..errors import MinispecError
from ..sampling import sample
from .base import Draft, Drafter, check_vocabularies


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
        self.cache = None  # the draft model's KV cache, made by start
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last draft)

    def start(self, prompt_ids, cache) -> None:
        """New generation: a fresh, empty cache of the draft model."""
        if max(prompt_ids) >= self.model.vocab_size:
            raise MinispecError(
                f"prompt_ids: token id {max(prompt_ids)} is outside the vocabulary of draft "
                f"{self.model.name!r} (0..{self.model.vocab_size - 1})")
        self.cache = self.model.new_cache(min(cache.max_len + 1,
                                              self.model.config.max_position_embeddings))
        self.calls, self._synced, self._fed = 0, 0, []

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Sample gamma tokens from the draft model, one forward call each (see propose_batch:
        this is the batch of one)."""
        return self.propose_batch([self], [context], [gamma], warp, [rng])[0]

    def propose_batch(self, drafters, contexts, gammas, warp, rngs) -> list[Draft]:
        """Each sequence's chain of drafts, one call of the draft model per step for every
        sequence still drafting (minispec/batched.py), each with its own draft cache. The first
        call also feeds the context tokens a cache has not seen. The last draft is not fed:
        nothing needs its logits this round."""
        model = self.model
        plans = [d.prepare(c, g) for d, c, g in zip(drafters, contexts, gammas)]  # (g, tokens)
        drafts = [np.empty(g, dtype=np.int64) for g, _ in plans]
        qs = [np.empty((g, self.vocab_size)) for g, _ in plans]
        feed = [tokens for _, tokens in plans]
        for i in range(max((g for g, _ in plans), default=0)):
            live = [b for b, (g, _) in enumerate(plans) if g > i]  # still drafting
            hs = batch_hidden(model, [feed[b] for b in live], [drafters[b].cache for b in live])
            logits = batch_head(model, hs, [1] * len(live))  # [1, V_draft] each
            for b, row in zip(live, logits):
                drafters[b].calls += 1
                qs[b][i] = warp(row[0])  # [V]: only the row we sample from
                drafts[b][i] = sample(qs[b][i], rngs[b])
                feed[b] = [int(drafts[b][i])]
        out = []
        for d, c, (g, _), tokens, q in zip(drafters, contexts, plans, drafts, qs):
            d._synced, d._fed = (len(c), tokens[:-1].tolist()) if g else (d.cache.length, [])
            out.append(Draft(tokens, q) if g else d.empty_draft())
        return out

    def draft_step(self):
        return self.model, None

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
            return 0, []
        if len(context) + gamma - 1 > self.cache.max_len:  # grow (rare): re-read the context
            self.cache = model.new_cache(
                min(model.config.max_position_embeddings, 2 * (len(context) + gamma)))
            tokens = context
        return gamma, tokens

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
