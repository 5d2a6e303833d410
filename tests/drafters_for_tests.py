"""Drafters of one's own for tests/test_verify_distribution.py (`--drafter module:factory`):
one exact (a tree whose siblings are drawn without replacement from the draft model), one that
draws its tokens greedily but reports the sampling q."""

import numpy as np

import minispec
from minispec.core.sampling import sample
from minispec.tree import TreeDrafter


class LookupTree(TreeDrafter):
    """Two children of the context drawn without replacement from the draft model's q, each
    with one child drawn from q after it: a tree written against the public contract only."""

    name = "lookup-tree"

    def __init__(self, target, draft, greedy=False):
        super().__init__(target)
        self.draft, self.greedy = draft, greedy

    def propose(self, context, gamma, warp, rng):
        if gamma < 2:
            return self.empty_draft()
        q0 = warp(minispec.backend.to_host(self.draft.logits(context))[-1])
        tokens, parents, q = [], [], []
        s = q0.copy()
        for _ in range(min(2, int(np.count_nonzero(s)))):
            x = int(np.argmax(s)) if self.greedy else sample(s / s.sum(), rng)
            s[x] = 0.0
            tokens.append(x)
            parents.append(-1)
            q.append(q0)
        for i in range(len(tokens)):
            q1 = warp(minispec.backend.to_host(self.draft.logits(context + [tokens[i]]))[-1])
            tokens.append(int(np.argmax(q1)) if self.greedy else sample(q1, rng))
            parents.append(i)
            q.append(q1)
        return minispec.Draft(np.array(tokens), np.array(q), np.array(parents),
                              "without-replacement")


def exact(target, draft):
    return LookupTree(target, draft)


def greedy(target, draft):
    return LookupTree(target, draft, greedy=True)


class Wrapping(minispec.Drafter):
    """A drafter that passes another's drafts on, altered: a planted bug's shell. `inner` keeps
    its own state; a subclass overrides propose."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.target)

    def start(self, prompt_ids, cache):
        self.inner.start(prompt_ids, cache)

    def accept(self, context, hidden):
        self.inner.accept(context, hidden)
