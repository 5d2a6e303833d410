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

from dataclasses import dataclass

import numpy as np

from ..errors import MinispecError


@dataclass
class Draft:
    """What a drafter proposes for one round."""

    tokens: np.ndarray  # int64 [g]: the draft tokens, in order
    q: np.ndarray  # float64 [g, V]: row i is the (warped) distribution tokens[i] was drawn from


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
