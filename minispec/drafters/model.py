"""Draft with a second, smaller model: M_q in Leviathan et al. 2023 (section 2.3)."""

from __future__ import annotations

import numpy as np

from ..batched import batch_head, batch_hidden
from ..errors import MinispecError
from ..sampling import sample
from ..sampling import warp as softmax  # at temperature 1: the plain softmax
from .base import Draft, Drafter, check_vocabularies
from .vocab import DraftHead


class ModelDrafter(Drafter):
    """Draft with a smaller model sharing the target's tokenizer (vocabularies checked here).

    Its KV cache holds a prefix of the context: after a round it is rolled back to the tokens the
    target kept, and the next `propose` feeds whatever it has not seen yet (the correction or
    bonus token, plus the last draft when every draft was accepted) in one multi-token call.

    Two options, both exact (the verify step is unchanged) and off by default:
    draft_vocab: ascending token ids; the draft computes only their rows of its LM head and
        gives every other token q = 0 (FR-Spec; drafters/vocab.py). For a draft whose output
        layer is most of its weights (a small model over a 49,152-token vocabulary) this is
        most of the cost of a draft token.
    stop: a chain of dynamic length. Before drafting token i, the chance that the chain so far
        and token i are all kept is estimated by the draft's own probabilities (the product of
        those of the tokens drafted so far, times its top probability now); below `stop` the
        chain ends. The choice reads only what was drafted before token i, never token i, so
        each drafted token is still kept with min(1, p/q). It pays only where the draft's
        probabilities say how likely it is to be kept: a draft distilled to the target's
        distributions (SmolLM2's) is close; the shipped toy draft is not, and drafts too little.
    """

    name = "model"

    def __init__(self, target, model, draft_vocab=None, stop: float | None = None) -> None:
        super().__init__(target)
        check_vocabularies(target, model)
        if stop is not None and not (isinstance(stop, (int, float)) and not isinstance(stop, bool)
                                     and 0 <= stop < 1):
            raise MinispecError(f"model: stop must be a probability in [0, 1), got {stop!r:.40}")
        self.model = model
        self.stop = None if stop is None else float(stop)
        self.draft_head = None if draft_vocab is None else DraftHead(
            model, draft_vocab, "model draft_vocab")
        self.cache = None  # the draft model's KV cache, made by start
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last one,
        # or all of them when `stop` ended the chain before a draw)

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
        todo = [g for g, _ in plans]  # drafts each sequence may still make (stop shortens it)
        drafts = [np.empty(g, dtype=np.int64) for g in todo]
        qs = [np.empty((g, self.vocab_size)) for g in todo]
        feed = [tokens for _, tokens in plans]
        fed = [0] * len(plans)  # of each chain's drafts, how many went into its cache
        sure = [1.0] * len(plans)  # the estimated chance that each chain so far is kept
        for i in range(max(todo, default=0)):
            live = [b for b, g in enumerate(todo) if g > i]  # still drafting
            if not live:  # every chain ended early
                break
            hs = batch_hidden(model, [feed[b] for b in live], [drafters[b].cache for b in live])
            logits = self.heads(hs)  # [1, V_draft] each
            for b, row in zip(live, logits):
                drafters[b].calls += 1
                fed[b] = i  # drafts 0..i-1 are in the cache now
                if self.stop is not None:  # see `stop` in the class docstring
                    own = softmax(row[0], 1.0)  # the draft's own (unwarped) distribution
                    if sure[b] * own.max() < self.stop:
                        todo[b] = i  # token i would not be kept often enough: end here
                        continue
                qs[b][i] = warp(row[0])  # [V]: only the row we sample from
                drafts[b][i] = sample(qs[b][i], rngs[b])
                feed[b] = [int(drafts[b][i])]
                if self.stop is not None:
                    sure[b] *= float(own[drafts[b][i]])
                    if sure[b] < self.stop:  # no later token can pass: the same chain, sooner
                        todo[b] = i + 1
        out = []
        for d, c, g, n, tokens, q in zip(drafters, contexts, todo, fed, drafts, qs):
            d._synced, d._fed = (len(c), tokens[:n].tolist()) if g else (d.cache.length, [])
            out.append(Draft(tokens[:g], q[:g]) if g else d.empty_draft())
        return out

    def heads(self, hs) -> list:
        """The LM head on each sequence's last hidden row: the draft's own, or its rows of the
        draft vocabulary (host logits, -inf outside it)."""
        if self.draft_head is None:
            return batch_head(self.model, hs, [1] * len(hs))
        rows = self.draft_head(self.model.xp.concatenate([h[-1:] for h in hs]))  # [B, V]
        return [rows[b:b + 1] for b in range(len(hs))]

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
