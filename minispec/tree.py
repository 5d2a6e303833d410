"""Trees of drafts: several candidates per position, scored in one target call, verified
losslessly. A reader of the chain (minispec/core/) can skip this file: the core never imports
it. A drafter that proposes trees subclasses `TreeDrafter`, whose `round` (`tree_round`) the
loop plays instead of the chain round: the same six steps, with the tree's one target call and
its walk in place of steps 2 and 3.

A tree draft is n nodes: tokens [n], parents [n] (parents[i] < i is node i's parent, -1 for a
child of the last context token) and q [n, V], the distribution node i was drawn from. A chain
is the tree with parents = [-1, 0, 1, ...].

The one target call (`hidden_tree`). The nodes are laid out flat after the n_ctx context tokens,
node i in cache slot n_ctx + i but at position n_ctx + depth(i) (depth 0 for a child of the
context); a tree attention mask lets node i attend to the context and to its own ancestors only
(Miao et al. 2024, SpecInfer; Cai et al. 2024, Medusa). Row i of the output is then exactly what a
plain forward pass over context + the path to node i would give at its last position.

Verification (`verify_tree`) walks from the root. At a node whose target distribution is r
(the row of p after that node), its children are tried in turn; child c, with token x drawn
from a proposal s_c, is accepted with probability min(1, r(x) / s_c(x)); if it is rejected, r
becomes norm(max(0, r - s_c)) and the next child is tried; if every child is rejected, the
final token is drawn from r. An accepted child becomes the current node (r = its row of p); at
a leaf the final token is the bonus, drawn from its row of p.

Why the output is the target's distribution. One step is the rejection-sampling lemma of
Leviathan et al. (Appendix A.1): if x ~ s and is kept with probability min(1, r(x)/s(x)), then
P(kept, x) = min(r(x), s(x)), and P(rejected) r'(y) with r' = norm(max(0, r - s)) makes up the
rest: P(emit y) = min(r(y), s(y)) + max(0, r(y) - s(y)) = r(y). Applied again to r' with the
next sibling, it holds as long as that sibling is a fresh draw from a proposal fixed by what
came before it (Miao et al. 2024, SpecInfer, Theorem 4.2; Jeon et al. 2024, recursive
speculative decoding). The three ways minispec's drafters draw siblings give three proposals:

    "independent"           siblings i.i.d. from q[c] (the parent's draft distribution):
                            s_c = q[c]
    "without-replacement"   sibling k drawn from q without the tokens of siblings 1..k-1:
                            s_c = norm(q[c] with those tokens zeroed); a rejected token has
                            r'(x) = 0, so it never needs proposing again
    "deterministic"         the candidates are fixed given the context (the draft's top-k):
                            s_c = one-hot(x), kept with probability r(x)

Descending into an accepted child is exact for the same reason a chain is: its children were
drawn before any verdict, from the drafter's distribution given the path, independent of the
uniforms used to judge. On a chain every proposal is "independent" with one child: the walk is
Algorithm 1 step for step (tests/test_tree.py checks it against `verify`). At temperature 0
every r and q is one-hot: the walk follows the child equal to the target's argmax, as deep as
it goes, then emits the target's own token.
"""

from __future__ import annotations

import time

import numpy as np

from .core import speculative as chain
from .core.drafter import Draft, Drafter
from .core.model import block, causal_mask
from .core.sampling import sample
from .errors import MinispecError

SIBLINGS = ("independent", "without-replacement", "deterministic")


def depths(parents) -> np.ndarray:
    """Depth of each node: 0 for a child of the context, parent's depth + 1 otherwise."""
    d = np.zeros(len(parents), dtype=np.int64)
    for i, a in enumerate(parents):
        d[i] = 0 if a < 0 else d[a] + 1
    return d


def children_of(parents) -> dict[int, list[int]]:
    """{node: its children in order}, with -1 for the root (the last context token)."""
    kids: dict[int, list[int]] = {-1: []}
    for i, a in enumerate(parents):
        kids.setdefault(int(a), []).append(i)
        kids.setdefault(i, [])
    return kids


def check_tree(tokens, parents, q, siblings: str, V: int, who: str) -> None:
    """MinispecError naming `who` unless (tokens, parents, q, siblings) is a valid tree."""
    n = len(tokens)
    parents = np.asarray(parents)
    if parents.shape != (n,) or not np.issubdtype(parents.dtype, np.integer):
        raise MinispecError(f"{who}: parents must be an integer array [n] = [{n}], got shape "
                            f"{parents.shape} dtype {parents.dtype}")
    if n and not all(-1 <= int(a) < i for i, a in enumerate(parents)):
        raise MinispecError(f"{who}: parents[i] must be -1 or an earlier node (< i), got "
                            f"{parents.tolist()!r:.200}")
    if siblings not in SIBLINGS:
        raise MinispecError(f"{who}: siblings must be one of {' | '.join(SIBLINGS)}, got "
                            f"{siblings!r:.60}")
    if np.shape(q) != (n, V):
        raise MinispecError(f"{who}: q must be [n, V] = [{n}, {V}], got {np.shape(q)}")


# ---- the round, for drafters whose drafts may be trees -------------------------------------


def tree_round(drafter: Drafter, context: list[int], cache, gamma: int, warp, verify,
               rng: np.random.Generator, eos: tuple[int, ...]) -> chain.Round:
    """minispec.core.speculative.speculative_round for a draft that may be a tree: draft, one
    target call over every node, walk the tree (`settle`), keep the accepted path."""
    t0 = time.perf_counter()
    draft = check_draft(drafter.propose(context, gamma, warp, rng), gamma, drafter,
                        room=cache.max_len - len(context))
    t1 = time.perf_counter()
    hidden = drafter.target_forward(context[cache.length:], draft, cache)  # [m + n, D]
    p = warp(drafter.target.lm_head(hidden[-len(draft.tokens) - 1:]))  # [n+1, V]
    path, token = settle(verify, p, draft, rng)
    r = finish_round(drafter, context, cache, draft, path, token, hidden, eos)
    r.gamma, r.draft_seconds, r.verify_seconds = gamma, t1 - t0, time.perf_counter() - t1
    return r


def settle(verify, p, draft: Draft, rng) -> tuple[list[int], int]:
    """Step 3 of a round -> (path: the accepted drafts' node indices, token: the target's
    correction or bonus). A chain goes to `verify` (its accepted prefix is nodes 0..a-1); a tree
    is walked by `verify_tree` (or by the `verify_tree` of a custom verify that has one, with
    its signature: minispec/html_trace.py's records the walk)."""
    if draft.parents is None:
        accepted, token = chain.settle(verify, p, draft, rng)
        return list(range(accepted)), token
    if verify is chain.verify:
        return verify_tree(p, draft.q, draft.tokens, draft.parents, draft.siblings, rng)
    walk = getattr(verify, "verify_tree", None)
    if walk is None:
        raise MinispecError(f"verify: {getattr(verify, '__name__', repr(verify))} verifies "
                            "chains; this round's draft is a tree, which "
                            "minispec.tree.verify_tree verifies")
    path, token = walk(p, draft.q, draft.tokens, draft.parents, draft.siblings, rng)
    return check_walk(path, token, draft.parents.tolist(), p.shape[1], verify), int(token)


def finish_round(drafter: Drafter, context: list[int], cache, draft: Draft, path: list[int],
                 token: int, hidden, eos: tuple[int, ...]) -> chain.Round:
    """Steps 4-6 of a round, chain or tree (each sequence of a batch too): the target's cache
    keeps the accepted path, then minispec.core.speculative.end_round."""
    if draft.parents is None:
        return chain.finish_round(drafter, context, cache, draft, len(path), token, hidden, eos)
    m = hidden.shape[0] - len(draft.tokens)  # the context tokens the call fed before the nodes
    keep_path(cache, path)
    emitted = [int(draft.tokens[i]) for i in path] + [int(token)]
    depth = int(depths(draft.parents).max(initial=-1)) + 1
    leaf = not children_of(draft.parents)[path[-1] if path else -1]
    return chain.end_round(drafter, context, draft.tokens.tolist(), emitted,
                           kept_rows(hidden, m, path, drafter.target.xp), eos, depth, leaf)


def kept_rows(hidden, m: int, path: list[int], xp):
    """The rows of the verify call's hidden states [m + n, D] that were kept: the m context
    rows, then the accepted path's nodes (for a chain, simply the first m + len(path) rows)."""
    if path == list(range(len(path))):
        return hidden[: m + len(path)]
    return hidden[xp.asarray(np.concatenate([np.arange(m), m + np.asarray(path, dtype=np.int64)]))]


def check_draft(draft, gamma: int, drafter, room: int | None = None) -> Draft:
    """The drafter's proposal, checked: a chain (minispec.core.speculative.check_draft), or a
    tree at most gamma deep, pruned to its first `room` nodes when the cache has no room for
    more. A tree shaped like a chain is returned as the chain. MinispecError names the drafter
    and what it returned."""
    if not isinstance(draft, Draft) or draft.parents is None:
        return chain.check_draft(draft, gamma, drafter)
    who = f"drafter {drafter.name!r}"
    tokens, q, V = np.asarray(draft.tokens), np.asarray(draft.q), drafter.vocab_size
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise MinispecError(f"{who}: draft tokens must be a 1-D integer array [n], got shape "
                            f"{tokens.shape} dtype {tokens.dtype}")
    n = tokens.shape[0]
    check_tree(tokens, draft.parents, q, draft.siblings, V, who)  # gamma bounds its depth
    parents = np.asarray(draft.parents, dtype=np.int64)
    if n and depths(parents).max() >= gamma:
        raise MinispecError(f"{who}: the tree must be at most gamma = {gamma} deep")
    if n and (tokens.min() < 0 or tokens.max() >= V):
        raise MinispecError(f"{who}: draft token ids must be in 0..{V - 1}, got "
                            f"{tokens.tolist()!r:.200}")
    tokens = tokens.astype(np.int64, copy=False)
    if np.array_equal(parents, np.arange(n) - 1):  # a chain
        if draft.siblings == "deterministic":  # proposed with certainty
            q = np.zeros_like(q, dtype=np.float64)
            q[np.arange(n), tokens] = 1.0
        return Draft(tokens, q)
    if room is not None and n > room:  # near the cache's end: the first nodes only (a prefix of
        tokens, q, parents = tokens[:room], q[:room], parents[:room]  # the list is a tree)
    return Draft(tokens, q, parents, draft.siblings)


def check_walk(path, token, parents: list[int], V: int, verify) -> list[int]:
    """A custom verify_tree's path as a list, or MinispecError if it is not a path of the tree
    from a root (nodes whose parents chain back to the context) plus one token id in 0..V-1."""
    def whole(x) -> bool:
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    if isinstance(path, np.ndarray) and path.ndim == 1:
        path = path.tolist()
    path = list(path) if isinstance(path, (list, tuple)) else None
    ok = (path is not None and whole(token) and 0 <= token < V
          and all(whole(c) and 0 <= c < len(parents) for c in path)
          and all(parents[c] == (path[k - 1] if k else -1) for k, c in enumerate(path)))
    if not ok:
        name = getattr(verify, "__name__", repr(verify))
        raise MinispecError(f"verify {name}: verify_tree should return (a root-to-node path of "
                            f"the tree with parents {parents}, one token), got "
                            f"{(path, token)!r:.200}")
    return path


class TreeDrafter(Drafter):
    """The base of a drafter that proposes trees (a Draft with parents) as well as chains: the
    loop plays `tree_round` for it, and its target call lays a tree out in one call."""

    round = staticmethod(tree_round)

    def propose(self, context, gamma, warp, rng) -> Draft:
        """Draft continuing `context`: a chain of g <= gamma tokens, or a tree at most gamma
        deep (Draft with parents and siblings, see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__}.propose")

    def target_forward(self, unseen: list[int], draft: Draft, cache):
        """Drafter.target_forward, for a tree too: node i's row in len(unseen) + i, its keys and
        values in slot cache.length + i until `keep_path` keeps the accepted ones."""
        if draft.parents is None:
            return super().target_forward(unseen, draft, cache)
        return hidden_tree(self.target, unseen, draft.tokens, draft.parents, cache)


# ---- the one target call over a tree --------------------------------------------------------


def hidden_tree(model, unseen: list[int], tokens, parents, cache, done: int = 0):
    """Feed `unseen` (context tokens the cache lacks, laid out as a chain) and tree nodes
    tokens[done:] in one call -> the last hidden states h [len(unseen) + n - done, D].

    The cache keeps the unseen tokens (cache.length grows by len(unseen)); the nodes' keys and
    values wait in the slots after it, node i in slot n_ctx + i (n_ctx: the context length), until
    `keep_path` keeps the accepted ones. Nodes 0..done-1 must already be in their slots (a
    drafter growing a tree level by level); then unseen must be empty.
    """
    xp = model.xp
    ids = np.concatenate([np.asarray(unseen, dtype=np.int64),
                          np.asarray(tokens, dtype=np.int64)[done:]])  # [T]
    if ids.size and (ids.min() < 0 or ids.max() >= model.vocab_size):
        raise MinispecError(f"hidden_tree: token ids must be in 0..{model.vocab_size - 1}")
    steps = getattr(model, "fast_steps", None)  # cuda_graphs.py's, or cpu_steps.py's
    if steps is not None and not done:  # the speed path, if it serves
        h = steps.hidden_tree(ids, parents, len(unseen), cache)
        if h is not None:
            return h
    positions = tree_positions(cache.length + len(unseen), parents, len(unseen), done)
    h = model.weights["embed"][xp.asarray(ids)]  # [T] -> [T, D]
    if model.weights["pos_embed"] is not None:
        h = h + model.weights["pos_embed"][xp.asarray(positions)]  # + [T, D]
    return tree_layers(model, h, parents, cache, len(unseen), done)


def tree_positions(n_ctx: int, parents, m: int, done: int) -> np.ndarray:
    """The positions of the rows a tree call feeds: the unseen tokens' n_ctx-m..n_ctx-1, then node
    i's n_ctx + depth(i) for i >= done."""
    fed = np.concatenate([np.arange(n_ctx - m, n_ctx), n_ctx + depths(parents)[done:]])
    return fed.astype(np.int64)


def tree_layers(model, h, parents, cache, m: int = 0, done: int = 0):
    """Every layer of `model` over input rows h [m + n - done, D]: m unseen rows continuing the
    cache, then tree nodes done..n-1 (see hidden_tree) -> [m + n - done, D]. For a drafter whose
    inputs are not token embeddings (EAGLE feeds features)."""
    xp, config = model.xp, model.config
    n_ctx = cache.length + m  # the context length once the unseen is in
    pos_fed, mask, first = tree_mask(model, parents, cache, m, done)
    rot = model.rope_rows(pos_fed)  # 2 x [T, E/2] or None
    mask = xp.asarray(mask)
    for i in range(model.n_layers):  # block() writes slots first.. and attends over 0..S-1
        h = block(xp, h, model.weights["layers"][i], config, rot, (cache.k[i], cache.v[i]),
                  first, mask)  # [T, D] -> [T, D]
    cache.length = n_ctx
    return h


def tree_mask(model, parents, cache, m: int = 0, done: int = 0):
    """For a call of tree_layers: the rows' positions [T], the attention mask [T, S] (host) and
    the first slot the rows are written to, after checking that the nodes fit."""
    config = model.config
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    if done and m:
        raise MinispecError("hidden_tree: a unseen can only come with the first nodes (done=0)")
    n_ctx = cache.length + m  # the context length once the unseen is in
    positions = n_ctx + depths(parents)  # [n] the position each node would have in its sequence
    if n_ctx + n > cache.max_len:
        raise MinispecError(f"hidden_tree: {n_ctx} context positions + {n} tree nodes do not fit "
                            f"the KV cache (max_len={cache.max_len})")
    if n and int(positions.max()) >= config.max_position_embeddings:
        raise MinispecError(f"hidden_tree: the tree reaches position {int(positions.max())}, "
                            f"past the context length ({config.max_position_embeddings})")
    pos_fed = tree_positions(n_ctx, parents, m, done)  # [T]

    # the mask [T, S]: the unseen is causal; node i sees the context and its ancestors
    mask = np.zeros((len(pos_fed), n_ctx + n), dtype=bool)
    mask[:m, :n_ctx] = causal_mask(np, n_ctx - m, m, n_ctx, None)
    ancestor = np.eye(n, dtype=bool)  # [n, n] ancestor-or-self
    for i, a in enumerate(parents):
        if a >= 0:
            ancestor[i] |= ancestor[a]
    mask[m:, :n_ctx] = True
    mask[m:, n_ctx:] = ancestor[done:]
    window = config.sliding_window
    if window is not None:  # key positions: the context's own, then each node's
        key_pos = np.concatenate([np.arange(n_ctx), positions])
        mask &= (pos_fed[:, None] - key_pos[None, :]) < window
    first = n_ctx + done if not m else n_ctx - m  # the first slot written
    return pos_fed, mask, first


def keep_path(cache, path: list[int]) -> None:
    """Keep the accepted nodes' keys and values (path: node indices, root to leaf), moved to
    consecutive positions right after the context; forget every other node."""
    n_ctx = cache.length
    moved = [i for i, node in enumerate(path) if node != i]  # a chain's path stays in place
    if moved:
        src = n_ctx + np.asarray(path)[moved]
        dst = n_ctx + np.asarray(moved)
        cache.k[:, :, dst] = cache.k[:, :, src]  # the right side is a copy: overlap is safe
        cache.v[:, :, dst] = cache.v[:, :, src]
    cache.length = n_ctx + len(path)


# ---- verification ---------------------------------------------------------------------------


def verify_tree(p, q, tokens, parents, siblings: str, rng: np.random.Generator,
                trace: list | None = None) -> tuple[list[int], int]:
    """Walk the tree from the root -> (path: the accepted nodes, root to leaf; token: the
    correction drawn from the last residual, or the bonus after a leaf).

    p [n+1, V]: row 0 the target's distribution after the context, row i+1 after node i.
    q [n, V]: the distribution node i was drawn from (its parent's draft distribution).
    siblings: how siblings were drawn (see the module docstring). Pure: uses only `rng`.
    trace: a list to append the walk to, for showing it (minispec/html_trace.py): one dict per
    child tried (node, token, s(x), r(x), the uniform u, kept: u s(x) < r(x)), then the last
    distribution r the token was drawn from.
    """
    tokens = [int(t) for t in tokens]
    kids = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        r = np.asarray(p[node + 1], dtype=np.float64)  # the target's distribution after node
        tried: list[int] = []
        for c in kids[node]:
            x = tokens[c]
            s = proposal(q[c], x, tried, siblings)
            u = rng.random()
            kept = bool(u * s[x] < r[x])  # kept with probability min(1, r(x) / s(x))
            if trace is not None:
                trace.append({"node": c, "token": x, "s": float(s[x]), "r": float(r[x]),
                              "u": u, "kept": kept})
            if kept:
                path.append(c)
                node = c
                break
            r = residual(r, s)
            tried.append(x)
        else:  # every child rejected (or a leaf): the target's own token
            if trace is not None:
                trace.append({"last": r, "rejected": bool(tried)})
            return path, sample(r, rng)


def proposal(q_row, x: int, tried: list[int], siblings: str) -> np.ndarray:
    """The distribution a sibling with token x was drawn from, given the siblings before it."""
    if siblings == "deterministic":
        s = np.zeros(len(q_row))
        s[x] = 1.0
        return s
    s = np.asarray(q_row, dtype=np.float64)
    if siblings == "without-replacement" and tried:
        s = s.copy()
        s[tried] = 0.0
        s /= s.sum()
    return s


def residual(r, s) -> np.ndarray:
    """norm(max(0, r - s)): what is left of r after a rejection. When s covers r everywhere
    (r <= s), the rejection had probability 0; r is kept then, as verify() does."""
    res = np.maximum(r - s, 0.0)
    total = res.sum()
    return res / total if total > 0 else r
