"""A draft model that proposes a tree: its top-k candidates at each depth (minispec/tree.py).

A chain bets everything on one guess per position; when the draft's first choice is wrong its
second often is not. The tree keeps the draft's k_d most likely tokens at depth d under every
node of depth d - 1 (shape (k_1, ..., k_depth)), so the target can take whichever branch it
agrees with, still in one call (SpecInfer, Miao et al. 2024; Medusa's candidate trees).

At temperature 0 the candidates are the draft's top-k tokens, a deterministic function of the
context, each verified as a one-hot proposal (siblings="deterministic"): "follow the child equal
to the target's argmax". When sampling they are k distinct draws from the draft distribution,
without replacement (siblings="without-replacement"), each kept with min(1, r(x) / s(x)) for its
renormalized proposal s: top-k candidates would be kept only with r(x), which at temperature 1
wastes most of the tree. Both are exact (minispec/tree.py).
"""

from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..core.drafter import Draft, check_vocabularies
from ..core.sampling import sample
from ..errors import MinispecError
from ..tree import TreeDrafter, hidden_tree


def tree_size(shape) -> int:
    """Nodes in a tree where each node of depth d - 1 has shape[d - 1] children."""
    n, width = 0, 1
    for k in shape:
        width *= k
        n += width
    return n


def check_shape(shape, who: str = "tree", max_nodes: int | None = 64) -> tuple[int, ...]:
    """A tree shape as a tuple of positive ints (at most max_nodes nodes, at most 16 children
    and 16 levels), or MinispecError."""
    if isinstance(shape, str):
        try:
            shape = [int(k) for k in shape.split(",")]
        except ValueError:
            raise MinispecError(f"{who}: expected children per depth like 3,2,1, got "
                                f"{shape!r:.60}") from None
    try:
        shape = tuple(shape)
    except TypeError:
        raise MinispecError(f"{who}: expected a sequence of children per depth, got "
                            f"{shape!r:.60}") from None
    if (not shape or len(shape) > 16
            or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                       and 1 <= k <= 16 for k in shape)
            or (max_nodes is not None and tree_size(shape) > max_nodes)):
        raise MinispecError(f"{who}: expected positive children per depth (e.g. 3,2,1) and at "
                            f"most {max_nodes or 'any number of'} nodes, got {shape!r:.60}")
    return tuple(int(k) for k in shape)


def sibling_mode(q_row) -> str:
    """How a tree's children are chosen this round: at temperature 0 (the draft distribution
    one-hot) the draft's top-k tokens ("deterministic"); otherwise k distinct tokens drawn from
    the draft distribution without replacement, so that each is kept with min(1, r(x) / s(x))
    rather than only with r(x) as a one-hot candidate would be."""
    return "deterministic" if np.count_nonzero(q_row) == 1 else "without-replacement"


def top_k(row, k: int) -> list[int]:
    """The indices of the k largest values of row, largest first, ties by the lower index: what
    np.argsort(-row, kind="stable")[:k] gives, without sorting the whole row (a sort of a
    49,152-token vocabulary takes ~1 ms, and a tree sorts a dozen rows a round)."""
    if k <= 16:  # k argmaxes: each the first of the largest left
        r, out = np.array(row, copy=True), []
        for _ in range(min(k, r.size)):
            x = int(r.argmax())
            if not r[x] > -np.inf:  # -inf or NaN: the sort below settles those
                break
            out.append(x)
            r[x] = -np.inf
        if len(out) == min(k, r.size):
            return out
    return [int(x) for x in np.argsort(-row, kind="stable")[:k]]


def children(logits_row, q_row, k: int, mode: str, rng) -> list[int]:
    """The tokens of a node's children: the top k by logit, or k draws from q_row without
    replacement, in the order drawn (the order verify_tree tries them in)."""
    if mode == "deterministic":
        return top_k(logits_row, k)
    s, out = np.array(q_row, dtype=np.float64), []
    for _ in range(min(k, int(np.count_nonzero(s)))):
        x = sample(s / s.sum(), rng)
        out.append(x)
        s[x] = 0.0
    return out


class TreeModelDrafter(TreeDrafter):
    """Draft a tree with a smaller model: the top shape[d] tokens under each node of depth d.

    The draft model grows the tree level by level, one call per level, each level's nodes
    attending to the context and their own ancestors (the same tree mask the target uses).
    Its cache holds the context; a round's nodes wait in the slots after it and are forgotten.
    """

    name = "model-tree"

    def __init__(self, target, model, shape=(2, 2, 1, 1)) -> None:
        super().__init__(target)
        check_vocabularies(target, model)
        self.model, self.shape = model, check_shape(shape)
        self.cache = None  # the draft model's KV cache, made by start

    def start(self, prompt_ids, cache) -> None:
        if max(prompt_ids) >= self.model.vocab_size:
            raise MinispecError(f"prompt_ids: token id {max(prompt_ids)} is outside the "
                                f"vocabulary of draft {self.model.name!r}")
        self.cache = self.model.new_cache(min(cache.max_len,
                                              self.model.config.max_position_embeddings))
        self.calls = 0

    def propose(self, context, gamma, warp, rng) -> Draft:
        model, cache = self.model, self.cache
        levels = self.shape[:gamma]
        while levels and len(context) + tree_size(levels) > model.config.max_position_embeddings:
            levels = levels[:-1]  # near the draft's context limit: a shallower tree
        prefix = context[cache.length:]  # what the target kept since the last round
        if not levels or max(prefix) >= model.vocab_size:
            return self.empty_draft()
        if len(context) + tree_size(levels) > cache.max_len:  # grow (rare): re-read everything
            self.cache = cache = model.new_cache(min(model.config.max_position_embeddings,
                                                     2 * (len(context) + tree_size(levels))))
            prefix = context
        tokens, parents, q = [], [], []
        h = hidden_tree(model, prefix, [], [], cache)[-1:]  # [1, D]: after the context
        frontier, mode = [-1], None  # the nodes whose children this level adds
        for d, k in enumerate(levels):
            logits = to_host(model.lm_head(h))[:, : self.vocab_size]  # [len(frontier), V]
            self.calls += 1
            probs = warp(logits)  # [len(frontier), V]: the draft's distribution after each node
            mode = mode or sibling_mode(probs[0])
            first = len(tokens)
            for row, node in enumerate(frontier):
                for x in children(logits[row], probs[row], k, mode, rng):
                    tokens.append(x)
                    parents.append(node)
                    q.append(probs[row])
            frontier = list(range(first, len(tokens)))
            if d + 1 < len(levels):  # the next level needs this level's hidden states
                h = hidden_tree(model, [], tokens, parents, cache, done=first)
        return Draft(np.array(tokens, dtype=np.int64), np.array(q), np.array(parents), mode)
