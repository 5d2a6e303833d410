"""The drafter contract: what the speculative loop asks of anything that proposes tokens.

Leviathan et al. 2023 draft with a smaller model M_q (section 2.3) and note that any cheaper
approximation works, down to trivial n-gram models; speculative sampling is lossless for every
drafter, provided it reports q, the exact distribution each draft token was drawn from. A
drafter that always proposes the same token given its context reports a one-hot q.

The loop (minispec/speculative.py) calls the same four methods on every drafter, in this order,
for one sequence (generate) or for each sequence of a batch (generate_batch):

    start(prompt_ids, cache)                    once per generation (cache: the target's, empty)
    propose(context, gamma, warp, rng) -> Draft          each round: its tokens and their q
    verify_forward(prefix, draft, cache) -> hidden       each round: the one target call
    accept(context, hidden)                     each round, after verification

A Draft is a tree of n nodes: tokens [n], q [n, V] and parents [n]. A chain is the tree whose
node i is node i-1's child (parents -1, 0, 1, ...: Draft's default), at most gamma long; a tree
branches (minispec/tree.py), at most gamma deep. The loop tells them apart by the shape alone:
nothing else says which kind a drafter drafts, and one drafter may propose either.

Per-sequence state lives in what `start` creates: a batch serves each sequence with its own
`fork()` of the drafter (a shallow copy, sharing weights and settings), then starts it. Two
optional methods let a drafter serve a whole batch in fewer calls (`propose_batch`,
`verify_forward_batch`); by default each sequence is asked in turn and the target verifies
every chain in one batched call. Autoregressive decoding is the same loop with `NoDrafter`,
which never drafts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..batched import batch_hidden
from ..errors import MinispecError
from ..tree import hidden_tree


@dataclass
class Draft:
    """What a drafter proposes for one round: n nodes, a chain unless parents say otherwise."""

    tokens: np.ndarray  # int64 [n]: the draft tokens (a chain: in order)
    q: np.ndarray  # float64 [n, V]: row i is the (warped) distribution tokens[i] was drawn from
    # parents[i] < i is node i's parent, -1 for a child of the context; None: a chain (-1, 0, 1,
    # ...). siblings: how siblings were drawn, "independent" | "without-replacement" |
    # "deterministic" (minispec/tree.py; on a chain "deterministic" means q is one-hot)
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

    def __init__(self, target) -> None:
        self.target = target
        self.vocab_size = sampled_vocab_size(target)
        self.calls = 0

    def start(self, prompt_ids: list[int], cache) -> None:
        """A new generation begins from `prompt_ids`: create every piece of per-generation state
        here (fresh, never reused from an earlier generation: a fork serving another sequence
        may still hold it). `cache` is the target's KV cache for it, still empty: most drafters
        ignore it; one built from the target's own layers drafts in it (EarlyExitDrafter).
        Raise MinispecError if the prompt is one this drafter cannot read."""
        self.calls = 0

    def propose(self, context: list[int], gamma: int, warp, rng: np.random.Generator) -> Draft:
        """Draft continuing `context`: a chain of g <= gamma tokens (g may be 0), or a tree at
        most gamma deep.

        warp(logits [..., V']) -> probabilities [..., V]: the temperature/top-k/top-p the target's
        logits go through, over the V ids generation samples from (a narrower draft vocabulary
        is padded with probability 0). Row i of q must be the exact distribution tokens[i] was
        drawn from. Every random number comes from `rng`.
        """
        raise NotImplementedError(f"{type(self).__name__}.propose")

    def verify_forward(self, prefix: list[int], draft: Draft, cache):
        """The round's one target call: `prefix` (the context tokens the cache lacks: the last
        one, the whole prompt in round 1) at positions cache.length.., then the draft's n nodes.

        Returns the target's last hidden states h [len(prefix) + n, D], node i's row in
        len(prefix) + i. Afterwards cache.length counts the context (it grew by len(prefix))
        and node i's keys and values wait in slot cache.length + i, until the loop keeps the
        accepted ones (minispec.tree.keep_path; a chain's stay where they are). A drafter that
        already computed part of this call while drafting may override it to skip that work,
        with the same result.
        """
        if draft.parents is None:  # a chain: a plain causal call
            h = self.target.hidden(prefix + draft.tokens.tolist(), cache)  # [m + n, D]
            cache.length -= len(draft.tokens)
            return h
        return hidden_tree(self.target, prefix, draft.tokens, draft.parents, cache)

    def accept(self, context: list[int], hidden) -> None:
        """Verification is done: `context` now ends with the emitted tokens. hidden [n, D] holds
        the target's last hidden states of the positions the verify call fed and kept, positions
        len(context)-1-n .. len(context)-2 (the last row produced the last emitted token).
        Drop whatever state no longer matches the context; catching up can wait for `propose`."""

    def empty_draft(self) -> Draft:
        """No drafts this round: the round is one plain target step."""
        return Draft(np.empty(0, dtype=np.int64), np.empty((0, self.vocab_size)))

    def draft_step(self):
        """What one draft step runs, for timing (minispec.batch.calibrate): (model, layers), the
        model's first `layers` layers (None: all) and its head, or None for a drafter without a
        forward call."""
        return None

    # -- serving a batch (minispec/batch.py); the defaults suit every drafter -------------------

    def fork(self) -> Drafter:
        """A drafter like this one for another sequence of a batch: the same weights and
        settings; `start` then gives it state of its own."""
        return copy.copy(self)

    def propose_batch(self, drafters: list[Drafter], contexts, gammas, warp, rngs
                      ) -> list[Draft]:
        """`propose` for each sequence of a batch (drafters: their forks of this drafter). A
        drafter with a model overrides this to draft for all of them in one call per step."""
        return [d.propose(c, g, warp, r) for d, c, g, r in zip(drafters, contexts, gammas, rngs)]

    def verify_forward_batch(self, drafters: list[Drafter], prefixes, drafts, caches) -> list:
        """`verify_forward` for each sequence of a batch -> one hidden [m_b + n_b, D] each: every
        chain in one batched target call (minispec/batched.py), a tree on its own."""
        if type(self).verify_forward is not Drafter.verify_forward:  # the drafter's own call
            return [d.verify_forward(p, t, c) for d, p, t, c in
                    zip(drafters, prefixes, drafts, caches)]
        chains = [b for b, t in enumerate(drafts) if t.parents is None]
        out = [None] * len(drafts)
        fed = [prefixes[b] + drafts[b].tokens.tolist() for b in chains]
        hs = batch_hidden(self.target, fed, [caches[b] for b in chains]) if chains else []
        for b, h in zip(chains, hs):
            caches[b].length -= len(drafts[b].tokens)
            out[b] = h
        for b, t in enumerate(drafts):
            if t.parents is not None:
                out[b] = drafters[b].verify_forward(prefixes[b], t, caches[b])
        return out


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
    if tok_t is not tok_d and _vocab(tok_t) != _vocab(tok_d):
        raise MinispecError(
            f"draft {draft.name!r} and target {target.name!r} have different tokenizers "
            "(their token -> id maps differ): speculative decoding needs a shared vocabulary"
        )
    if draft.vocab_size < tok_d.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, fewer than the "
            f"{tok_d.vocab_size} tokens of its tokenizer: it cannot read every token"
        )


def _vocab(tokenizer) -> dict[str, int]:
    tok = getattr(tokenizer, "tok", tokenizer)  # minispec.Tokenizer wraps a tokenizers.Tokenizer
    return tok.get_vocab(with_added_tokens=True)
