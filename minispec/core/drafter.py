"""The drafter contract, and the drafter of the paper: a second, smaller model.

Leviathan et al. 2023 draft with a smaller model M_q (section 2.3) and note that any cheaper
approximation works, down to trivial n-gram models; speculative sampling is lossless for every
drafter, provided it reports q, the exact distribution each draft token was drawn from. A
drafter that always proposes the same token given its context reports a one-hot q.

The loop (minispec/core/speculative.py) calls four methods on a drafter, in this order:

    start(prompt_ids, cache)                    once per generation (cache: the target's, empty)
    propose(context, gamma, warp, rng) -> Draft          each round: its tokens and their q
    target_forward(unseen, draft, cache) -> hidden       each round: the one target call
    accept(context, hidden)                     each round, after verification

Autoregressive decoding is the same loop with `NoDrafter`, which never drafts. Everything else
extends this contract from outside the core: trees of drafts (minispec/tree.py: a drafter that
proposes trees is a `TreeDrafter`, whose `round` the loop plays instead of the chain round),
batches (minispec/batch.py), and the other drafters (minispec/drafters/).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import MinispecError
from .sampling import sample


@dataclass
class Draft:
    """What a drafter proposes for one round: n draft tokens, a chain unless parents say otherwise.
    """

    tokens: np.ndarray  # int64 [n]: the draft tokens (a chain: in order)
    q: np.ndarray  # float64 [n, V]: row i is the (warped) distribution tokens[i] was drawn from
    # a tree's shape, None for a chain (minispec/tree.py): parents[i] < i is node i's parent, -1
    # for a child of the context; siblings says how siblings were drawn ("independent" |
    # "without-replacement" | "deterministic"; on a chain "deterministic" means q is one-hot)
    parents: np.ndarray | None = None
    siblings: str = "independent"


def sampled_vocab_size(target) -> int:
    """The token ids generation samples from: the target's vocabulary, without the embedding
    rows padded past its tokenizer (they are no token: nothing decodes them, no drafter has them).
    """
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        return target.vocab_size
    return min(target.vocab_size, tokenizer.vocab_size)


class Drafter:
    """The base every drafter subclasses; a subclass overrides `propose` and what else it needs.

    target: the model whose output the drafts are verified against (a drafter is made for one
    target). vocab_size: V, the ids generation samples from; q has V columns. calls: draft
    forward calls since `start` (0 for a drafter without a model), read for the statistics.
    """

    name = "drafter"  # a short label for statistics and traces
    # the round the loop plays, called round(drafter, context, ...) (a staticmethod): None for
    # the chain round, speculative_round; a drafter that proposes trees: minispec/tree.py's
    round = None

    def __init__(self, target) -> None:
        self.target = target
        self.vocab_size = sampled_vocab_size(target)
        self.calls = 0

    def start(self, prompt_ids: list[int], cache) -> None:
        """A new generation begins from `prompt_ids`: create every piece of per-generation state
        here (fresh, never reused from an earlier generation: a copy serving another sequence
        of a batch may still hold it). `cache` is the target's KV cache for it, still empty:
        most drafters ignore it; one built from the target's own layers drafts in it
        (EarlyExitDrafter). Raise MinispecError if the prompt is one this drafter cannot read."""
        self.calls = 0

    def propose(self, context: list[int], gamma: int, warp, rng: np.random.Generator) -> Draft:
        """Draft a chain of g <= gamma tokens continuing `context` (g may be 0).

        warp(logits [..., V']) -> probabilities [..., V]: the temperature/top-k/top-p the target's
        logits go through, over the V ids generation samples from (a narrower draft vocabulary
        is padded with probability 0). Row i of q must be the exact distribution tokens[i] was
        drawn from. Every random number comes from `rng`.
        """
        raise NotImplementedError(f"{type(self).__name__}.propose")

    def target_forward(self, unseen: list[int], draft: Draft, cache):
        """The round's one target call: `unseen` (the context tokens the cache lacks: the last
        one, the whole prompt in round 1) at positions cache.length.., then the g drafts.

        Returns the target's last hidden states h [len(unseen) + g, D]. Afterwards cache.length
        counts the context only (it grew by len(unseen)); the drafts' keys and values wait in
        the positions after it until the loop keeps the accepted ones. A drafter that already
        computed part of this call while drafting may override it to skip that work, with the
        same result.
        """
        h = self.target.hidden_states(unseen + draft.tokens.tolist(), cache)  # [m + g, D]
        cache.length -= len(draft.tokens)
        return h

    def accept(self, context: list[int], hidden) -> None:
        """Verification is done: `context` now ends with the emitted tokens. hidden [n, D] holds
        the target's last hidden states of the positions the verify call fed and kept, positions
        len(context)-1-n .. len(context)-2 (the last row produced the last emitted token).
        Drop whatever state no longer matches the context; catching up can wait for `propose`."""

    def empty_draft(self) -> Draft:
        """No drafts this round: the round is one plain target step."""
        return Draft(np.empty(0, dtype=np.int64), np.empty((0, self.vocab_size)))


class NoDrafter(Drafter):
    """Never drafts: the loop then decodes autoregressively, one target call per token."""

    name = "none"

    def propose(self, context, gamma, warp, rng) -> Draft:
        return self.empty_draft()


def check_vocabularies(target, draft) -> None:
    """Raise MinispecError unless model `draft` can propose tokens for model `target`.

    Both must index the same tokens: with tokenizers on both sides, the same token -> id map;
    without, a draft vocabulary no larger than the target's. The target's may be larger (its
    embedding padded past the tokenizer, as in Qwen2.5 pairs): the padded ids get q = 0.
    """
    if draft is target:
        return
    if draft.vocab_size > target.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, larger than target "
            f"{target.name!r} ({target.vocab_size}): the draft must use the target's vocabulary"
        )
    tok_t, tok_d = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if tok_t is None or tok_d is None:
        return
    if tok_t is not tok_d and not _same_vocab(tok_t, tok_d):
        raise MinispecError(
            f"draft {draft.name!r} and target {target.name!r} have different tokenizers "
            "(their token -> id maps differ): speculative decoding needs a shared vocabulary"
        )
    if draft.vocab_size < tok_d.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, fewer than the "
            f"{tok_d.vocab_size} tokens of its tokenizer: it cannot read every token"
        )


def _same_vocab(tok_t, tok_d) -> bool:
    """Whether two tokenizers map the same tokens to the same ids. A pair found alike is
    remembered with both sizes (reading and comparing SmolLM2's 49,152 tokens takes ~0.2 s, at
    every ModelDrafter made); a tokenizer's map changes only by tokens added, which change its
    size, and then the pair is compared again."""
    a, b = (getattr(t, "tok", t) for t in (tok_t, tok_d))  # minispec.Tokenizer wraps one
    sizes = (a.get_vocab_size(with_added_tokens=True), b.get_vocab_size(with_added_tokens=True))
    alike = _ALIKE.setdefault(a, weakref.WeakKeyDictionary())  # of a: b -> sizes when alike
    if alike.get(b) != sizes:
        if a.get_vocab(with_added_tokens=True) != b.get_vocab(with_added_tokens=True):
            return False
        alike[b] = sizes
    return True


_ALIKE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> alike ones


class ModelDrafter(Drafter):
    """Draft with a smaller model sharing the target's tokenizer (vocabularies checked here).

    Its KV cache holds a prefix of the context: after a round it is rolled back to the tokens the
    target kept, and the next `propose` feeds whatever it has not seen yet (the correction or
    bonus token, plus the last draft when every draft was accepted) in one multi-token call.
    minispec/drafters/draft_model.py adds two exact options (a chain of dynamic length, a cut
    draft vocabulary) and drafts for a whole batch in one call per step.
    """

    name = "model"

    def __init__(self, target, model) -> None:
        super().__init__(target)
        check_vocabularies(target, model)
        self.model = model
        self.cache = None  # the draft model's KV cache, made by start
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last one)

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
        """Sample g tokens from the draft model, one forward call each. The first call also feeds
        the context tokens the cache has not seen; the last draft is not fed: nothing needs its
        logits this round."""
        g, feed = self.prepare(context, gamma)
        if g == 0:
            self._synced, self._fed = self.cache.length, []
            return self.empty_draft()
        tokens = np.empty(g, dtype=np.int64)
        q = np.empty((g, self.vocab_size))
        for i in range(g):
            h = self.model.hidden_states(feed, self.cache)  # [T, D]
            logits = self.model.lm_head(h[-1:])[0]  # [V_draft]: only the row we sample from
            self.calls += 1
            q[i] = warp(logits)  # [V]
            tokens[i] = sample(q[i], rng)
            feed = [int(tokens[i])]
        self._synced, self._fed = len(context), tokens[:g - 1].tolist()
        return Draft(tokens, q)

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
