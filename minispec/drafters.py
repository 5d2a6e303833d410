"""Drafters: whatever proposes the gamma tokens the target then verifies.

Leviathan et al. 2023 draft with a smaller model M_q (section 2.3) and note that any cheaper
approximation works, down to trivial n-gram models; speculative sampling is lossless for every
drafter, provided it reports q, the exact distribution each draft token was drawn from. A
drafter that always proposes the same token given its context reports a one-hot q.

`speculative_generate` drives a drafter in rounds:
    start(prompt_ids)                                 once per generation
    propose(context, gamma, warp_fn, rng) -> (draft tokens [g], q [g, V])
    accept(context)                                   context now ends with the emitted tokens
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from .errors import MinispecError
from .sampling import sample


class Drafter(Protocol):
    """The interface `speculative_generate` drives; see the module docstring for the call order.

    name: short label for stats and traces ("model" | "ngram" | "early-exit").
    calls: model forward calls made since `start` (0 for drafters with no model); read for stats.
    """

    name: str
    calls: int

    def start(self, prompt_ids: list[int]) -> None:
        """Forget the previous generation; `prompt_ids` is the context the first round sees."""

    def propose(
        self,
        context: list[int],
        gamma: int,
        warp_fn: Callable[[object], np.ndarray],
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draft g <= gamma tokens (g may be 0) continuing `context`.

        Returns draft tokens int64 [g] and q float64 [g, V]: row i is the exact distribution
        token i was drawn from, after warp_fn (the same temperature/top-k/top-p warp the target
        gets; warp_fn takes logits [..., V] and returns probabilities over the V token ids
        generation samples from). q may have fewer columns than V: the missing trailing ones
        count as probability 0 (a draft model without the target's padded ids). Random draws
        come from `rng` only.
        """

    def accept(self, context: list[int]) -> None:
        """Verification done: `context` now ends with the emitted tokens (a prefix of the drafts
        plus one). Drop whatever state no longer matches it; catching up can wait for `propose`."""


def is_model(obj) -> bool:
    """True for a minispec Model (something with forward/new_cache), False for a Drafter."""
    return hasattr(obj, "forward") and hasattr(obj, "new_cache") and not hasattr(obj, "propose")


class ModelDrafter:
    """Draft with a second, smaller model sharing the target's tokenizer (M_q in Leviathan et al.).

    Its KV cache holds a prefix of the context: after a round it is rolled back to the tokens the
    target kept, and the next `propose` feeds whatever it has not seen yet (the correction or
    bonus token, plus the last draft when every draft was accepted) in one multi-token call.
    """

    name = "model"

    def __init__(self, model) -> None:
        self.model = model
        self.cache = None
        self.calls = 0
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last draft)

    def start(self, prompt_ids: list[int]) -> None:
        """New generation: an empty cache (allocated once, reused by later generations)."""
        if self.cache is None:
            self.cache = self.model.new_cache()
        self.cache.rollback(0)
        self.calls, self._synced, self._fed = 0, 0, []

    def propose(self, context, gamma, warp_fn, rng):
        """Sample gamma tokens from the draft model, one forward call each; the first call also
        feeds the context tokens the cache has not seen. The last draft is not fed: nothing
        needs its logits this round."""
        model = self.model
        # the cache will hold context + drafts[:-1]; near the draft's own context limit, draft less
        gamma = min(gamma, model.config.max_position_embeddings - len(context) + 1)
        tokens = context[self.cache.length :]  # catch-up: tokens accepted since the last round
        if gamma < 1 or (tokens and max(tokens) >= model.vocab_size):
            # nothing to draft, or the target sampled an id past this model's vocabulary (only
            # possible without tokenizers): the round is one target step
            self._synced, self._fed = self.cache.length, []
            return np.empty(0, dtype=np.int64), np.empty((0, model.vocab_size))
        if len(context) + gamma - 1 > self.cache.max_len:  # grow (rare): re-read the context
            self.cache = model.new_cache(
                min(model.config.max_position_embeddings, 2 * (len(context) + gamma))
            )
            tokens = context
        drafts = np.empty(gamma, dtype=np.int64)
        q = []
        for i in range(gamma):
            logits = model.forward(tokens, self.cache)  # [T, V_draft]
            self.calls += 1
            q.append(warp_fn(logits[-1]))  # [V_draft]: only the row we sample from
            drafts[i] = sample(q[-1], rng)
            tokens = [int(drafts[i])]
        self._synced, self._fed = len(context), drafts[:-1].tolist()
        return drafts, np.stack(q)

    def accept(self, context: list[int]) -> None:
        """Roll the cache back to the drafts the target kept (the rest of `context` is caught up
        on in the next `propose`)."""
        n = self._synced
        for d in self._fed:
            if n == len(context) or context[n] != d:
                break
            n += 1
        self.cache.rollback(n)


def check_vocabularies(target, draft) -> None:
    """Raise MinispecError unless `draft` can propose tokens for `target`.

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
    if not _same_vocab(tok_t, tok_d):
        raise MinispecError(
            f"draft {draft.name!r} and target {target.name!r} have different tokenizers "
            "(their token -> id maps differ): speculative decoding needs a shared vocabulary"
        )
    if draft.vocab_size < tok_d.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, fewer than the "
            f"{tok_d.vocab_size} tokens of its tokenizer: it cannot read every token"
        )


# (id(a), id(b)) -> (a, b) for tokenizer pairs found equal; holding the pair keeps the ids valid
_checked_pairs: dict[tuple[int, int], tuple] = {}


def _same_vocab(a, b) -> bool:
    """Same token -> id map (special tokens included); each pair is compared once."""
    if a is b or (id(a), id(b)) in _checked_pairs:
        return True
    same = _vocab(a) == _vocab(b)
    if same:
        _checked_pairs[(id(a), id(b))] = (a, b)
    return same


def _vocab(tokenizer) -> dict[str, int]:
    tok = getattr(tokenizer, "tok", tokenizer)  # minispec.Tokenizer wraps a tokenizers.Tokenizer
    return tok.get_vocab(with_added_tokens=True)
