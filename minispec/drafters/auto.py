"""Auto: prompt lookup where the text repeats the context, the EAGLE head elsewhere, chosen round
by round.

The two drafters that need no draft model win on different text. Prompt lookup (ngram.py) is
free and, where the answer copies its prompt (a list pulled out of a paragraph, a function
echoed before it is completed), drafts long runs the target keeps; on open prose it finds
nothing, or something wrong. The EAGLE head (eagle.py) costs a small layer per draft but guesses
new text too. AutoDrafter asks, at the start of each round, whether the context's last `min_n`
or more tokens occurred earlier in it, each time followed by the same token: if so the round
copies what followed its latest occurrence (one-hot q); if not (no occurrence, or occurrences
that go on differently, as "in 1" before 1887, 1912 and 1934 in a list of dates, where a copy is
a guess), the head drafts (eagle-copy's chain: ended by its confidence, copying once a draft
agrees with a lookup, so the head picks between the occurrences, and at most `chain` drafts
long: a longer chain's drafts cost a head step and a verify row each, and with a well-trained
head they ran long enough not to pay).

How much a lookup round copies adapts, as gamma="auto" does for the loop (Leviathan et al.
leave gamma to the user; Hugging Face's "heuristic" schedule grows it after a fully accepted
round): after a lookup round whose copy was kept whole the next copy may be twice as long, up to
the loop's gamma; after a rejection it is one more than the tokens kept, at least `shortest`.
A copy the target keeps whole is text the answer is reproducing, where a long round pays: a
kept copy of 16 makes 17 tokens for one call, which on SmolLM2 in float32 cost 2.7-3.2 one-token
steps in the runs of `python -m minispec.workloads tune` (it prints the costs by rows).

Exactness. The choice of drafter and the copy's length read only the context and the rounds
already verified, never a draw of this round; so each round is a plain round of one of two
exact drafters, and verification keeps the target's distribution, token for token at T = 0.
The head still receives every round's true features (`accept`), so after lookup rounds it
catches up in one call of its layer over the positions it missed.
"""

from __future__ import annotations

import copy
from numbers import Integral

import numpy as np

from ..core.drafter import Draft
from ..errors import MinispecError
from ..tree import TreeDrafter
from .ngram import copy_from, find_ngrams, one_hot

LOOKUP_MIN_N = 2  # a lookup owns the round when the context's last 2+ tokens recur in it
LOOKUP_MAX_N = 3  # the longest suffix looked up (the longest that recurs picks the copy)
LOOKUP_FIRST = 8  # a generation's first lookup round copies up to 8 tokens
LOOKUP_SHORTEST = 4  # after a rejection, a copy of at least 4
LOOKUP_AGREE = True  # copy only where every earlier occurrence of the suffix goes on alike
HEAD_CHAIN = 4  # the most drafts a head round holds (tuned: weights/README.md; None: gamma)
_NOWHERE = np.zeros(0, dtype=np.int64)  # no place to copy from (as find_ngrams says it)


def _count(value, what: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
        raise MinispecError(f"auto: {what} must be an integer >= {least}, got {value!r:.40}")
    return int(value)


class AutoDrafter(TreeDrafter):
    """Prompt lookup when the context's suffix of at least min_n tokens (up to max_n) recurs
    earlier in it, else `head` (a drafter made for the same target: the EAGLE head; None: no
    drafts, a plain target step, where no head fits the target).

    first: the most tokens a generation's first lookup round copies; shortest: the least a copy
    shrinks to after a rejection (see the module docstring); chain: the most drafts a head round
    holds (None: the loop's gamma, which the head's confidence usually ends sooner); agree: a
    lookup round only where every earlier occurrence of the suffix is followed by the same
    token (where they differ, the head drafts; False: copy after the latest, as ngram does).
    `lookup_rounds` and `head_rounds` count the rounds each drafted since `start`.
    """

    name = "auto"

    def __init__(self, target, head, min_n: int = LOOKUP_MIN_N, max_n: int = LOOKUP_MAX_N,
                 first: int = LOOKUP_FIRST, shortest: int = LOOKUP_SHORTEST,
                 chain: int | None = HEAD_CHAIN, agree: bool = LOOKUP_AGREE) -> None:
        super().__init__(target)
        self.min_n, self.max_n = _count(min_n, "min_n"), _count(max_n, "max_n")
        if self.max_n < self.min_n:
            raise MinispecError(f"auto: max_n ({max_n}) must be >= min_n ({min_n})")
        self.first, self.shortest = _count(first, "first"), _count(shortest, "shortest")
        self.chain = None if chain is None else _count(chain, "chain")
        if head is not None and head.target is not target:
            raise MinispecError("auto: the head must be made for the same target")
        self.head = head
        self.agree = bool(agree)
        self.length, self.copied = self.first, None
        self.lookup_rounds = self.head_rounds = 0

    def __copy__(self) -> AutoDrafter:
        """A copy with a copy of the head (a batch gives each sequence its own drafter)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.head = copy.copy(self.head) if self.head is not None else None
        return new

    def start(self, prompt_ids, cache) -> None:
        if self.head is not None:
            self.head.start(prompt_ids, cache)
        self.calls = self.lookup_rounds = self.head_rounds = 0
        self.length, self.copied = self.first, None

    def propose(self, context, gamma, warp, rng) -> Draft:
        """A lookup's copy (q one-hot) where the context's suffix recurs, else the head's draft.
        """
        ctx = np.asarray(context, dtype=np.int64)
        ends = find_ngrams(ctx, self.max_n, self.min_n) if gamma > 0 else _NOWHERE
        if self.agree and ends.size > 1 and np.unique(ctx[ends]).size > 1:
            ends = _NOWHERE  # the places disagree on the next token: the head's round
        drafts = copy_from(ctx, int(ends[-1]), min(gamma, self.length), self.vocab_size) \
            if ends.size else []
        self.copied = (len(context), drafts) if drafts else None
        if drafts:
            self.lookup_rounds += 1
            return Draft(np.array(drafts, dtype=np.int64), one_hot(drafts, self.vocab_size))
        if self.head is None:
            return self.empty_draft()
        chain = gamma if self.chain is None else min(gamma, self.chain)
        draft = self.head.propose(context, chain, warp, rng)
        self.calls = self.head.calls
        self.head_rounds += 1
        return draft

    def accept(self, context, hidden) -> None:
        """After a lookup round, the next copy's length from how much of this one was kept;
        every round's kept features go to the head, whichever drafter drafted it."""
        if self.copied is not None:
            n, drafts = self.copied
            kept = next((i for i, x in enumerate(drafts)
                         if n + i >= len(context) or context[n + i] != x), len(drafts))
            self.length = 2 * len(drafts) if kept == len(drafts) else \
                max(kept + 1, self.shortest)
        if self.head is not None:
            self.head.accept(context, hidden)
