"""EAGLE: drafting at the feature level (Li et al. 2024, EAGLE; EAGLE-2 for the dynamic tree).

A draft model guesses tokens; EAGLE guesses the target's next *feature*, the last hidden state
before the final norm and LM head, which is smoother and more predictable than the token it
becomes, and lets the target's own frozen head turn the guess into a distribution.

One round, for a context x_0..x_{n-1} whose features f_0..f_{n-2} the target has computed:

    pairs (f_j, x_{j+1})  -> fc [2D -> D] -> one decoder layer (its own KV cache) -> g_{j+1}
                                            (g: the guessed feature at the next position)
    q_1 = warp(head(g_{n-1}))  -> draft d_1  (head = the target's final norm + LM head)
    pair (g_{n-1}, d_1) -> layer -> g_n  -> q_2 -> d_2 -> ...   (autoregressive in feature space)

The layer's input pairs the feature at position j with the token sampled there (x_{j+1} was
drawn from f_j's distribution): the token removes the sampling's uncertainty the feature alone
would leave (EAGLE's "feature and shifted token"). The feature is the last layer's output only
(EAGLE-1); EAGLE-3 fuses several layers' states, which added nothing in short fine-tunes of
the shipped heads (tried on both targets, weights/README.md).

After verification `accept` receives the target's true features of the kept positions (from
the verify call, no extra work), and the layer's cache is rolled back to the entries made from
true features: the next round re-feeds the accepted drafts with their true features, so a wrong
guess never compounds across rounds.

A chain may end early: with `stop` it ends where the estimated chance that all of it is kept
falls below a threshold (a dynamic draft length; the rule is decided before each draw, so it
stays exact). The estimate is the head's own probability, or, for a head whose config.json
carries the `acceptance` it measured on held-out text, that measured rate at its confidence.

Trees: with `shape` (children per depth) each node of depth d - 1 gets the top k_d tokens of
its guessed distribution (a static tree); with `dynamic=(beam, nodes)` the tree grows as in
EAGLE-2: at each depth only the `beam` nodes with the highest cumulative draft probability are
expanded (k_d children each), and the `nodes` most probable nodes overall are kept. At
temperature 0 the candidates are top-k tokens (one-hot proposals); a static tree, when sampling,
draws distinct candidates without replacement from the guessed distribution
(tree_model.children). A dynamic tree that ranks its nodes by the head's own probabilities
takes top-k candidates at every temperature, since keeping the sampled candidates the draft
likes best would bias them; a head with a measured `acceptance` ranks them by estimated chances
of being kept that never read the drawn token (rank_chances), so when sampling it may draw its
candidates too, where that is measured to pay (tree_mode). Either way the tree is verified
losslessly (minispec/tree.py).

Files (`weights/eagle`, made by `weights/train_heads.py`): config.json (the layer's shape) and
model.safetensors: fc.weight [D, 2D], fc.bias [D], and one Llama decoder layer under
model.layers.0.* (Hugging Face names).
"""

from __future__ import annotations

from numbers import Integral
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..config import ModelConfig, positive_float
from ..core.drafter import Draft
from ..core.model import Model, linear
from ..core.sampling import sample
from ..errors import MinispecError
from ..loader import _build_weights, random_model
from ..safetensors import SafetensorsFile
from ..tree import TreeDrafter, tree_layers
from .files import as_stored_heads, head_matrix, read_head_dir
from .ngram import copy_from, find_ngram, one_hot
from .tree_model import check_shape, children, sibling_mode
from .vocab import DraftVocab, cut_for, read_draft_vocab


class EagleDrafter(TreeDrafter):
    """Draft with an EAGLE head: a decoder layer over (feature, token) pairs.

    layer: a one-layer Model (its embedding, final norm and head are the target's); fc_w
    [2D, D] and fc_b [D] fuse a feature and a token embedding into the layer's input. shape:
    None for a chain, or children per depth for a tree; dynamic: (beam, nodes) for EAGLE-2's
    dynamic tree (with shape giving the children of each expanded node per depth); draft_vocab:
    the token ids the head may propose (ascending; None: all of them), see vocab.py.

    stop: a chain's dynamic length. Before drafting token i the estimated chance that the chain
    so far and token i are all kept is compared with `stop`; below it, the chain ends there (it
    may be empty: a plain target step). A token the head is unsure of is rarely accepted and
    costs a draft step and a verify row. The estimate: without `acceptance`, the head's own
    (unwarped) probability of the drafts made times the top probability of its next
    distribution; with it, the product of the measured rates at each step's confidence.
    The rule reads only the drafts already made and the next distribution, never the token about
    to be drawn, so every drafted token is still a plain draw from its q and verification stays
    exact (choosing after the draw would bias the drafts toward tokens the head likes).

    copy: prompt lookup inside the chain. Once a drafted token is the one a lookup of the
    context's last n >= `copy` tokens (and the drafts before it) proposes, the rest of the chain
    is copied from what followed that earlier occurrence, with one-hot q: the head's agreement
    says the text is repeating itself, and copied tokens cost no draft step. Whether to copy is
    decided by tokens already drawn, so each draft is still a plain draw from its q row (the
    head's for the drawn token, one-hot for a copied one) and verification stays exact. A copied
    stretch is not cut by `stop`.

    acceptance: how often the head's drafts were kept, measured (weights/train_heads.py):
    {"edges": [K] upper edges of confidence bins (the head's top probability), "greedy" and
    "sampled": [steps, K] rates per chain step and bin}, greedy for temperature 0 (the argmax
    is the target's), sampled for sampling (1 - TV at temperature 1, used at every temperature
    as an estimate); optionally "greedy_by_rank" and "sampled_by_rank" [ranks, K], the chance
    that a tree's rank-j top-k candidate is kept (is the target's argmax; the target's
    probability of it). A dynamic tree then ranks its nodes by estimated chances (their product
    along the path) instead of the head's own probabilities, and when sampling may draw its
    candidates (tree_mode, rank_chances); see read_acceptance.
    """

    name = "eagle"

    def __init__(self, target, layer: Model, fc_w, fc_b, shape=None, dynamic=None,
                 draft_vocab=None, stop: float | None = None, acceptance=None,
                 copy: int | None = None) -> None:
        super().__init__(target)
        D = target.config.hidden_size
        if layer.config.hidden_size != D or np.shape(fc_w) != (2 * D, D) or \
                np.shape(fc_b) != (D,):
            raise MinispecError(f"eagle: expected a layer of width {D} (the target's), fc weight "
                                f"[{2 * D}, {D}] and bias [{D}], got width "
                                f"{layer.config.hidden_size}, {np.shape(fc_w)}, {np.shape(fc_b)}")
        xp = target.xp
        self.layer = layer
        self.fc_w = head_matrix(xp, np.asarray(to_host(fc_w)).T, target.dtype)  # [2D, D]
        self.fc_b = xp.asarray(np.asarray(to_host(fc_b), dtype=target.dtype))
        # a dynamic tree keeps at most `nodes` of the candidates: the shape alone may be larger
        self.shape = None if shape is None else check_shape(
            shape, "eagle tree", None if dynamic is not None else 64)
        if dynamic is not None:
            if self.shape is None:
                raise MinispecError("eagle: a dynamic tree needs shape (children per depth)")
            beam, nodes = dynamic
            if not (isinstance(beam, int) and isinstance(nodes, int) and beam >= 1
                    and 1 <= nodes <= 64):
                raise MinispecError(f"eagle: dynamic must be (beam >= 1, nodes in 1..64), got "
                                    f"{dynamic!r:.60}")
        self.dynamic = dynamic
        if stop is not None and not (isinstance(stop, (int, float)) and not isinstance(stop, bool)
                                     and 0 <= stop < 1 and shape is None):
            raise MinispecError(f"eagle: stop must be a probability in [0, 1) and is for a "
                                f"chain (no tree), got {stop!r:.40}"
                                f"{' with a tree' if shape is not None else ''}")
        self.stop = None if stop is None else float(stop)
        if copy is not None and (isinstance(copy, bool) or not isinstance(copy, Integral)
                                 or copy < 1 or shape is not None):
            raise MinispecError(f"eagle: copy must be an integer >= 1 (the shortest n-gram "
                                f"looked up) and is for a chain (no tree), got {copy!r:.40}"
                                f"{' with a tree' if shape is not None else ''}")
        self.copy = None if copy is None else int(copy)
        self.acceptance = acceptance
        self.draft_head = DraftVocab(target, draft_vocab, "eagle draft_vocab")
        self.greedy_head = None  # at T = 0, the target's greedy vocabulary (greedy_vocab())
        self.cache, self.feats, self.known, self.synced = None, None, 0, 0

    # -- state ---------------------------------------------------------------------------------

    def start(self, prompt_ids, cache) -> None:
        """A new generation: the layer's cache and the store of true features, both empty."""
        n = cache.max_len  # the target's cache bounds every position this generation uses
        # fresh arrays for every generation (one layer: small), never shared with a copy of this
        # drafter serving another sequence of a batch
        self.cache = self.layer.new_cache(min(n + 64, self.layer.config.max_position_embeddings))
        self.feats = self.target.xp.zeros((self.cache.max_len, self.layer.config.hidden_size),
                                          dtype=self.target.dtype)
        self.calls, self.known, self.synced = 0, 0, 0

    def accept(self, context, hidden) -> None:
        """Store the target's true features of the kept positions (the last row is position
        len(context) - 2) and forget every layer entry made from a guessed one."""
        end = len(context) - 1
        self.feats[end - hidden.shape[0]:end] = hidden
        self.known = end
        self.cache.rollback(min(self.cache.length, self.synced))

    def fuse(self, feats, tokens):
        """The layer's input: fc(concat(feature, embedding of the token)) -> [T, D]."""
        xp = self.target.xp
        emb = self.target.weights["embed"][xp.asarray(np.asarray(tokens, dtype=np.int64))]
        return linear(xp.concatenate([feats, emb], axis=1), self.fc_w, self.fc_b)  # -> [T, D]

    def catch_up(self, context):
        """Feed the pairs (f_j, x_{j+1}) the layer has not seen, all with true features ->
        g_{n-1}, the guessed feature at the last context position [1, D], or None if the target
        has not computed the features yet (the first round)."""
        n = len(context)
        if self.known < n - 1 or n < 2:
            return None
        j0 = min(self.cache.length, n - 2)  # re-feed at least the last pair: its output is g
        self.cache.rollback(j0)
        x = self.fuse(self.feats[j0:n - 1], context[j0 + 1:n])  # [n-1-j0, D]
        g = self.layer.run_layers(x, self.cache, j0)[-1:]  # [1, D]
        self.cache.length = self.synced = n - 1
        return g

    # -- drafting ------------------------------------------------------------------------------

    def greedy_vocab(self, ids) -> None:
        """Draft over the token ids `ids` alone at temperature 0 (vocab.py: a greedy vocabulary;
        None: the draft vocabulary there too). Only where the head's own probabilities choose
        nothing (no `stop`, no dynamic tree): renormalised over a cut they would choose
        otherwise."""
        self.greedy_head = None if ids is None else DraftVocab(self.target, ids,
                                                                 "eagle greedy_vocab")

    def head(self, warp):
        """The LM head rows a draft step computes: the greedy vocabulary's at T = 0 (where it
        is used), else the draft vocabulary's."""
        if self.stop is not None or self.dynamic is not None:
            return self.draft_head
        return cut_for(warp, self.draft_head, self.greedy_head)

    def propose(self, context, gamma, warp, rng) -> Draft:
        room = self.cache.max_len - len(context) - 1
        gamma = min(gamma, room)
        g = self.catch_up(context) if gamma > 0 else None
        if g is None:
            return self.empty_draft()
        self.calls += 1
        if self.shape is not None:
            return self.propose_tree(g, gamma, warp, rng)
        tokens, q = [], []
        sure = 1.0  # the estimated chance that the chain so far is kept (for `stop`)
        head = self.head(warp)
        for i in range(gamma):
            logits = head(g)  # [1, V]
            q_i = warp(logits)[0]
            if self.stop is not None:  # decided before sampling: see `stop` in __init__
                own = np.exp(logits[0] - logits[0].max())
                own /= own.sum()  # the head's unwarped distribution
                chance = self.chance(own.max(), i, q_i)
                if sure * chance < self.stop:
                    break
            q.append(q_i)
            tokens.append(sample(q_i, rng))
            copied = self.copy_after(context, tokens, gamma) if self.copy is not None else []
            if copied:  # the rest of the chain is copied from the context: see `copy`
                tokens += copied
                q += list(one_hot(copied, self.vocab_size))
                break
            if self.stop is not None:
                sure *= chance if self.acceptance is not None else float(own[tokens[-1]])
                if sure < self.stop:  # no next token can pass (each chance is <= 1):
                    break  # the same chain, without the layer and head calls that would show it
            if i + 1 < gamma:  # the next guess: the pair (g, the token just drafted)
                pos = self.cache.length
                g = self.layer.run_layers(self.fuse(g, tokens[-1:]), self.cache, pos)
                self.cache.length = pos + 1
                self.calls += 1
        if not tokens:  # stopped before the first token
            return self.empty_draft()
        return Draft(np.array(tokens, dtype=np.int64), np.array(q))

    def copy_after(self, context, tokens, gamma) -> list[int]:
        """`copy`: the tokens that followed the draft just drawn (tokens[-1]) where a prompt
        lookup over the context and the drafts before it would have proposed it, up to gamma
        drafts in all; [] where no lookup of at least `copy` tokens proposes it."""
        ctx = np.asarray(list(context) + tokens[:-1], dtype=np.int64)  # what it was drawn after
        start = find_ngram(ctx, max(3, self.copy), self.copy)
        if start < 0 or ctx[start] != tokens[-1]:
            return []
        return copy_from(np.append(ctx, tokens[-1]), start + 1, gamma - len(tokens),
                         self.vocab_size)

    def chance(self, confidence: float, step: int, q_row) -> float:
        """The estimated chance that a draft at chain step `step` (0-based) is kept, given the
        head's top probability there: that probability itself, or the rate measured for it."""
        if self.acceptance is None:
            return float(confidence)
        kind = "greedy" if np.count_nonzero(q_row) == 1 else "sampled"  # T = 0: q one-hot
        rates = self.acceptance[kind]
        return float(rates[min(step, len(rates) - 1), self.confidence_bin(confidence)])

    def confidence_bin(self, confidence: float) -> int:
        """The `acceptance` bin of a top probability (bins end at its confidence_edges)."""
        edges = self.acceptance["edges"]
        return min(int(np.searchsorted(edges, confidence)), len(edges) - 1)

    def by_rank(self, confidence: float, k: int, q_row):
        """The measured chances that a node's top-k candidates are kept (rank j = 0..k-1): at
        temperature 0 that the rank-j token is the target's argmax, when sampling the target's
        probability of it; None if the head has no such table."""
        kind = "greedy_by_rank" if np.count_nonzero(q_row) == 1 else "sampled_by_rank"
        if self.acceptance is None or kind not in self.acceptance:
            return None
        rates, b = self.acceptance[kind], self.confidence_bin(confidence)
        return [float(rates[min(j, len(rates) - 1), b]) for j in range(k)]

    def tree_mode(self, confidence: float, k: int, q_row) -> str:
        """How a dynamic tree picks its candidates this round, decided at the root before any
        is drawn: the top-k ("deterministic"), unless it is sampling and the chance that the
        first of k drawn candidates is kept (the chain's measured a) beats the measured chance
        that one of the top k is ("without-replacement"). The first wins where the target's
        distributions are peaked, the second where they are flat (the toy target)."""
        top = self.by_rank(confidence, k, q_row)
        if top is None or np.count_nonzero(q_row) == 1:
            return "deterministic"
        drawn = self.chance(confidence, 0, q_row)
        return "without-replacement" if drawn > sum(top) else "deterministic"

    def rank_chances(self, confidence: float, depth: int, k: int, q_row, mode: str):
        """A dynamic tree's estimated chances that the k children of a node are kept, given
        the node's head distribution (top probability `confidence`) and depth: None without a
        measured `acceptance` (the head's own probabilities of the top-k tokens are used). For
        top-k children, by_rank. For children drawn without replacement, a (1 - a)^j for the
        j-th drawn, with a the chain's measured chance at this confidence and depth: it reads
        neither the drawn tokens nor their q, and falls with j, so a later sibling never
        outranks an earlier one (see propose_tree)."""
        if mode == "deterministic":
            return self.by_rank(confidence, k, q_row)
        a = self.chance(confidence, depth, q_row)
        return [a * (1.0 - a) ** j for j in range(k)]

    def propose_tree(self, g, gamma, warp, rng) -> Draft:
        """A tree of top-k candidates, static or EAGLE-2's dynamic (see the module docstring);
        the nodes' layer entries wait in the cache's slots past its length, like the target's."""
        levels = self.shape[:gamma]
        tokens, parents, q, score = [], [], [], []
        frontier, feats = [-1], g  # nodes to expand, and their guessed features [F, D]
        # a dynamic tree keeps the nodes its draft likes best: chosen by their q from sampled
        # candidates, that choice would bias them (a kept sibling would no longer be a plain
        # draw), so without a measured acceptance its candidates are the top-k, a function of
        # the context alone. With one, a node's score is its parent's times an estimate that
        # reads only the parent's distribution, the depth and the draw order (rank_chances):
        # whether a sampled child is kept then never depends on the token it drew.
        mode, head = None, self.head(warp)
        for d, k in enumerate(levels):
            logits = head(feats)  # [F, V]
            probs = warp(logits)
            top = logits.max(axis=1, keepdims=True)  # log-softmax: the draft's confidence
            logp = logits - (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))
            if mode is None:  # decided at the root, before any candidate is drawn
                mode = sibling_mode(probs[0]) if self.dynamic is None else self.tree_mode(
                    float(np.exp(logp[0].max())), k, probs[0])
            first = len(tokens)
            for row, node in enumerate(frontier):
                base = 0.0 if node < 0 else score[node]
                kids = children(logits[row], probs[row], k, mode, rng)
                rates = None if self.dynamic is None else self.rank_chances(
                    float(np.exp(logp[row].max())), d, len(kids), probs[row], mode)
                for j, x in enumerate(kids):
                    tokens.append(x)
                    parents.append(node)
                    q.append(probs[row])
                    score.append(base + (float(logp[row, x]) if rates is None
                                         else float(np.log(max(rates[j], 1e-9)))))
            new = list(range(first, len(tokens)))
            if self.dynamic is not None:  # expand only the `beam` most probable of this depth
                new = sorted(sorted(new, key=lambda i: -score[i])[: self.dynamic[0]])
            if (d + 1 == len(levels) or len(tokens) > 63
                    or self.cache.length + len(tokens) > self.cache.max_len):
                break  # the last depth, the most nodes, or the end of the cache: the nodes so
                # far are the tree (near the end the round prunes it to the target's room)
            x = self.fuse(self.parent_feats(g, feats, frontier, parents, first), tokens[first:])
            out = tree_layers(self.layer, x, parents, self.cache, 0, first)  # [new nodes, D]
            self.calls += 1
            feats = out[np.asarray(new) - first]
            frontier = new
        keep = list(range(len(tokens)))
        if self.dynamic is not None:  # the `nodes` most probable overall (ancestors first)
            keep = sorted(sorted(keep, key=lambda i: -score[i])[: self.dynamic[1]])
            keep = close_under_ancestors(keep, parents)
        index = {old: new for new, old in enumerate(keep)}
        return Draft(np.array([tokens[i] for i in keep], dtype=np.int64),
                     np.array([q[i] for i in keep]),
                     np.array([-1 if parents[i] < 0 else index[parents[i]] for i in keep]), mode)

    @staticmethod
    def parent_feats(g, feats, frontier, parents, first):
        """The guessed feature each new node's pair starts from: its parent's output."""
        row = {node: r for r, node in enumerate(frontier)}
        return feats[np.asarray([row[parents[i]] for i in range(first, len(parents))])]


def close_under_ancestors(keep, parents) -> list[int]:
    """keep plus every ancestor of a kept node, in index (topological) order."""
    out = set(keep)
    for i in keep:
        while parents[i] >= 0 and parents[i] not in out:
            out.add(parents[i])
            i = parents[i]
    return sorted(out)


# ---- files -------------------------------------------------------------------------------------


def _layer_config(target, cfg: dict, source: str) -> ModelConfig:
    c = target.config

    def field(name, kind, default=None):
        value = cfg.get(name, default)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise MinispecError(f"{source}: field {name!r} should be {kind.__name__}, got "
                                f"{value!r:.60}")
        return value

    D = field("hidden_size", int)
    if D != c.hidden_size:
        raise MinispecError(f"{source}: hidden_size {D} is not the target's ({c.hidden_size})")
    return ModelConfig(family="llama", vocab_size=c.vocab_size, hidden_size=D, n_layers=1,
                       n_heads=field("num_attention_heads", int),
                       n_kv_heads=field("num_key_value_heads", int),
                       head_dim=field("head_dim", int),
                       intermediate_size=field("intermediate_size", int),
                       max_position_embeddings=c.max_position_embeddings,
                       norm_eps=positive_float(field("rms_norm_eps", (int, float)),
                                               f"{source}: field 'rms_norm_eps'"),
                       rope_theta=positive_float(field("rope_theta", (int, float), 10000.0),
                                                 f"{source}: field 'rope_theta'"),
                       tie_word_embeddings=True)


def load_eagle(path, target, shape=None, dynamic=None, stop=None, copy=None) -> EagleDrafter:
    """An EAGLE head from a directory (config.json + model.safetensors) for `target`."""
    path = Path(path)
    cfg, st_file = read_head_dir(path, "an EAGLE head")
    cfg_file = path / "config.json"
    config = _layer_config(target, cfg, str(cfg_file))
    st = SafetensorsFile(st_file)
    shared = {"model.embed_tokens.weight": to_host(target.weights["embed"]),
              "model.norm.weight": to_host(target.weights["norm_w"])}

    def get(name):
        if name in shared:
            return shared[name]
        if name not in st:
            raise MinispecError(f"{st_file}: tensor {name!r} is missing")
        return st.get(name).astype(np.float32)

    xp = target.xp
    as_stored = as_stored_heads(st, target)  # the head's matrices as stored (F16, BF16), or None
    own = {id(a) for a in shared.values()}

    def put_linear(a):  # the target's own embedding (the tied LM head) as it is: no copy of it
        return a if id(a) in own else as_stored(a)

    weights = _build_weights(config, get, lambda a: xp.asarray(np.ascontiguousarray(
        a, dtype=target.dtype)), put_linear=put_linear if as_stored is not None else None)
    D = config.hidden_size
    fc_w, fc_b = get("fc.weight"), get("fc.bias")
    for name, a, shape_ in (("fc.weight", fc_w, (D, 2 * D)), ("fc.bias", fc_b, (D,))):
        if a.shape != shape_:
            raise MinispecError(f"{st_file}: tensor {name!r} has shape {list(a.shape)}, "
                                f"expected {list(shape_)}")
    for name in st.keys():
        if name != "draft_vocab" and not np.isfinite(st.get(name)).all():
            raise MinispecError(f"{st_file}: tensor {name!r} holds NaN or infinite values")
    layer = Model(config, weights, xp=xp, device=target.device, dtype=target.dtype,
                  name=f"eagle:{path.name}")
    if target.device == "cpu" and getattr(target, "fast_steps", None) is not None:
        from ..cpu_steps import enable_where_supported  # the target's speed path, its head too

        enable_where_supported(layer)
    if as_stored is not None:
        fc_w = as_stored(fc_w)  # as stored, like the layer's matrices
    return EagleDrafter(target, layer, fc_w.T, fc_b, shape, dynamic,
                        read_draft_vocab(st, cfg, cfg_file), stop,
                        read_acceptance(cfg, cfg_file), copy)


def read_acceptance(cfg: dict, source) -> dict | None:
    """config.json's optional "acceptance" (written by weights/train_heads.py) -> {"edges" [K],
    "greedy" [steps, K], "sampled" [steps, K], and when given "greedy_by_rank" and
    "sampled_by_rank" [ranks, K]} as arrays, or None: "confidence_edges", K increasing upper
    edges of bins of the head's top probability, the last 1; "greedy" and "sampled", one list
    of K rates in [0, 1] per chain step; the two "_by_rank", one per rank of a tree's top-k
    candidate."""
    a = cfg.get("acceptance")
    if a is None:
        return None
    if not isinstance(a, dict):
        raise MinispecError(f"{source}: field 'acceptance' should be an object, got {a!r:.60}")

    def numbers(value, name, shape_text):
        try:
            arr = np.array(value, dtype=np.float64)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.dtype == object or not np.isfinite(arr).all() or \
                any(isinstance(v, bool) for v in np.ravel(np.array(value, dtype=object))):
            raise MinispecError(f"{source}: acceptance.{name} should be {shape_text} of "
                                f"numbers, got {value!r:.60}")
        return arr

    edges = numbers(a.get("confidence_edges"), "confidence_edges", "a list")
    if edges.ndim != 1 or edges.size == 0 or (np.diff(edges) <= 0).any() or edges[0] <= 0 \
            or edges[-1] != 1:
        raise MinispecError(f"{source}: acceptance.confidence_edges should be increasing "
                            f"probabilities in (0, 1] ending at 1, got "
                            f"{a.get('confidence_edges')!r:.60}")
    out = {"edges": edges}
    by_rank = ("greedy_by_rank", "sampled_by_rank")
    for kind in ("greedy", "sampled") + (by_rank if any(k in a for k in by_rank) else ()):
        rates = numbers(a.get(kind), kind, "a list of lists")
        if rates.ndim != 2 or rates.shape[0] == 0 or rates.shape[1] != edges.size or \
                (rates < 0).any() or (rates > 1).any():
            raise MinispecError(f"{source}: acceptance.{kind} should be one list of "
                                f"{edges.size} rates in [0, 1] (one per confidence bin) per "
                                f"{'rank' if 'rank' in kind else 'chain step'}, got "
                                f"{a.get(kind)!r:.60}")
        out[kind] = rates
    return out


def random_eagle(target, *, seed: int = 0, scale: float = 0.3, shape=None,
                 dynamic=None, stop=None, copy=None) -> EagleDrafter:
    """An untrained EAGLE head (for tests): every code path runs; acceptance is by chance."""
    c = target.config
    config = ModelConfig(family="llama", vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                         n_layers=1, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
                         head_dim=c.head_dim, intermediate_size=c.intermediate_size,
                         max_position_embeddings=c.max_position_embeddings)
    layer = random_model(config, seed=seed, scale=scale, device=target.device)
    layer.weights["embed"] = target.weights["embed"]  # the target's own, as when loaded
    rng = np.random.default_rng(seed)
    D = c.hidden_size
    return EagleDrafter(target, layer, rng.normal(0, scale / np.sqrt(D), (2 * D, D)),
                        rng.normal(0, scale, D), shape, dynamic, stop=stop, copy=copy)
