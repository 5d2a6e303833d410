"""The drafter contract: what the speculative loop asks of anything that proposes tokens.

Leviathan et al. 2023 draft with a smaller model M_q (section 2.3) and note that any cheaper
approximation works, down to trivial n-gram models; speculative sampling is lossless for every
drafter, provided it reports q, the exact distribution each draft token was drawn from. A
drafter that always proposes the same token given its context reports a one-hot q.

The loop (minispec/speculative.py) calls the same four methods on every drafter, in this order:

    start(prompt_ids, cache)                   once per generation (cache: the target's, empty)
    propose(context, gamma, warp, rng) -> Draft          each round: up to gamma tokens, their q
    verify_forward(tokens, cache, n) -> (logits, hidden) each round: the one target call
    accept(context, hidden)                    each round, after verification

Autoregressive decoding is the same loop with `NoDrafter`, which never drafts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..batched import batch_head, batch_hidden
from ..errors import MinispecError


@dataclass
class Draft:
    """What a drafter proposes for one round."""

    tokens: np.ndarray  # int64 [g]: the draft tokens, in order
    q: np.ndarray  # float64 [g, V]: row i is the (warped) distribution tokens[i] was drawn from
    # a tree of drafts (minispec/tree.py; a chain leaves these alone): parents[i] < i is node
    # i's parent, -1 for a child of the context; siblings says how siblings were drawn
    # ("independent" | "without-replacement" | "deterministic")
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
    tree = False  # True: propose returns trees (Draft.parents), verified by minispec/tree.py

    def __init__(self, target) -> None:
        self.target = target
        self.vocab_size = sampled_vocab_size(target)
        self.calls = 0

    def start(self, prompt_ids: list[int], cache) -> None:
        """A new generation begins from `prompt_ids`. `cache` is the target's KV cache for it,
        still empty: most drafters ignore it; one built from the target's own layers drafts in it
        (EarlyExitDrafter). Raise MinispecError if the prompt is one this drafter cannot read."""
        self.calls = 0

    def propose(self, context: list[int], gamma: int, warp, rng: np.random.Generator) -> Draft:
        """Draft g <= gamma tokens (g may be 0) continuing `context`.

        warp(logits [..., V']) -> probabilities [..., V]: the temperature/top-k/top-p the target's
        logits go through, over the V ids generation samples from (a narrower draft vocabulary
        is padded with probability 0). Row i of q must be the exact distribution tokens[i] was
        drawn from. Every random number comes from `rng`.
        """
        raise NotImplementedError(f"{type(self).__name__}.propose")

    def verify_forward(self, tokens: list[int], cache, n_logits: int):
        """The round's one target call: feed `tokens` at positions cache.length.. (the context
        tokens the cache lacks, then the drafts), advancing the cache.

        Returns (logits [n_logits, V_target] of the last n_logits positions, the target's last
        hidden states h [T, D] of every position fed). A drafter that already computed part of
        this call while drafting may override it to skip that work, with the same result.
        """
        h = self.target.hidden(tokens, cache)  # [T, D]
        return self.target.head(h[-n_logits:]), h  # [n_logits, V], [T, D]

    def verify_tree_forward(self, prefix: list[int], draft: Draft, cache):
        """A tree drafter's target call: the context tokens the cache lacks and the tree's
        nodes, in one call with a tree attention mask -> hidden states [len(prefix) + n, D]
        (see minispec/tree.py: hidden_tree)."""
        from ..tree import hidden_tree

        return hidden_tree(self.target, prefix, draft.tokens, draft.parents, cache)

    def accept(self, context: list[int], hidden) -> None:
        """Verification is done: `context` now ends with the emitted tokens. hidden [n, D] holds
        the target's last hidden states of the positions the verify call fed and kept, positions
        len(context)-1-n .. len(context)-2 (the last row produced the last emitted token).
        Drop whatever state no longer matches the context; catching up can wait for `propose`."""

    def empty_draft(self) -> Draft:
        """No drafts this round: the round is one plain target step."""
        return Draft(np.empty(0, dtype=np.int64), np.empty((0, self.vocab_size)))

    def for_batch(self) -> BatchDrafting:
        """This drafter serving a batch of sequences (minispec/batch.py). By default one shallow
        copy of it per sequence, each started on its own prompt and asked in turn; a drafter with
        a model overrides this to draft for every sequence in one call per draft step."""
        return BatchDrafting(self)


class BatchDrafting:
    """A drafter serving a batch: one drafter state per sequence (a "slot"), and the batch's
    target call. This default asks each sequence's drafter in turn (a shallow copy of the
    drafter it was made from, started on that sequence's prompt) and, unless the drafter
    supplies its own verify_forward, verifies every sequence in one batched target call."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter, self.target = drafter, drafter.target
        self.name, self.vocab_size = drafter.name, drafter.vocab_size
        self.slots: dict[int, Drafter] = {}
        # the target's own forward, or one of the drafter's (early exit reuses its layers)
        self.own_forward = type(drafter).verify_forward is not Drafter.verify_forward

    def start(self, slot: int, prompt_ids: list[int], cache) -> None:
        """Sequence `slot` joins the batch, with its own target cache."""
        d = copy.copy(self.drafter)
        d.start(prompt_ids, cache)
        self.slots[slot] = d

    def calls(self, slot: int) -> int:
        return self.slots[slot].calls

    def propose(self, slots, contexts, gammas, warp, rngs) -> list[Draft]:
        """One Draft per sequence: up to gammas[b] tokens continuing contexts[b]."""
        return [self.slots[s].propose(c, g, warp, r)
                for s, c, g, r in zip(slots, contexts, gammas, rngs)]

    def verify_forward(self, slots, tokens, caches, n_logits):
        """The batch's target call: (logits [n_logits[b], V] per sequence, hidden [T_b, D] per
        sequence), each as Drafter.verify_forward would give it."""
        if self.own_forward:
            out = [self.slots[s].verify_forward(t, c, n)
                   for s, t, c, n in zip(slots, tokens, caches, n_logits)]
            return [o[0] for o in out], [o[1] for o in out]
        hs = batch_hidden(self.target, tokens, caches)  # one call for every sequence
        return batch_head(self.target, hs, n_logits), hs

    def accept(self, slot: int, context: list[int], hidden) -> None:
        self.slots[slot].accept(context, hidden)

    def finish(self, slot: int) -> None:
        """Sequence `slot` left the batch."""
        del self.slots[slot]


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
