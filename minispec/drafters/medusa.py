"""Medusa heads: the target drafts for itself from its own last hidden state (Cai et al. 2024).

Head k (k = 1..K) reads the target's last hidden state h at the position that produced the last
context token and guesses the token k positions after it; the target's own final norm and LM
head turn its output into logits (Medusa-1: one residual block per head):

    logits_k = head(h + SiLU(W_k h + b_k))            (head = the target's norm + LM head)

So drafting costs K small matmuls and no extra model: h comes from the previous verify call
(`accept` receives it), which is why the first round of a generation drafts nothing.

The heads guess each position independently of the others' guesses, and a guess at depth k is
often the second or third choice: Medusa drafts a tree, shape[k-1] candidates of head k under
every node of depth k - 1, verified in one target call (minispec/tree.py): at temperature 0 the
head's top tokens (one-hot proposals), when sampling distinct draws from the head's
distribution without replacement; both exact (tree_model.children). Medusa's own "typical
acceptance" trades that exactness for speed; it is not used here. Each node of a depth draws
its own candidates, so siblings under different parents may differ when sampling.

Files (`weights/medusa`, made by `weights/train_heads.py`): config.json with
"medusa_num_heads" and "hidden_size", and model.safetensors with medusa_head.{k}.weight
[D, D] (out x in) and medusa_head.{k}.bias [D], k = 0..K-1 (head k + 1 above).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..backend import to_host
from ..core.drafter import Draft
from ..core.model import linear, silu
from ..errors import MinispecError
from ..safetensors import SafetensorsFile
from ..tree import TreeDrafter
from .files import as_stored_heads, head_matrix, read_head_dir
from .tree_model import check_shape, children, sibling_mode
from .vocab import DraftVocab, cut_for, read_draft_vocab


class MedusaDrafter(TreeDrafter):
    """Draft a tree from K Medusa heads on the target's last hidden state.

    heads: K pairs (W [D, D] out x in, b [D]) as host or device arrays. shape: the children per
    depth, at most K deep; default (1,) * K, a chain of each head's top token. draft_vocab: the
    token ids the heads may propose (ascending; None: all of them), see vocab.py.
    """

    name = "medusa"

    def __init__(self, target, heads, shape=None, draft_vocab=None) -> None:
        super().__init__(target)
        xp, D = target.xp, target.config.hidden_size
        self.heads = []
        for k, (w, b) in enumerate(heads):
            if np.shape(w) != (D, D) or np.shape(b) != (D,):
                raise MinispecError(f"medusa head {k}: expected weight [{D}, {D}] and bias [{D}] "
                                    f"for a target of width {D}, got {np.shape(w)} and "
                                    f"{np.shape(b)}")
            # W stays [out, in], used through its transpose (as loader.py stores the target's
            # weights): the few-rows kernel multiplies it, a 16-bit one as it is
            self.heads.append((head_matrix(xp, w, target.dtype),
                               xp.asarray(np.asarray(to_host(b), dtype=target.dtype))))
        if not self.heads:
            raise MinispecError("medusa: expected at least one head")
        self.shape = check_shape((1,) * len(self.heads) if shape is None else shape,
                                 "medusa tree")
        if len(self.shape) > len(self.heads):
            raise MinispecError(f"medusa tree: {len(self.shape)} levels asked for, but only "
                                f"{len(self.heads)} heads")
        self.draft_head = DraftVocab(target, draft_vocab, "medusa draft_vocab")
        self.greedy_head = None  # at T = 0, the target's greedy vocabulary (greedy_vocab())
        self.h, self.seen = None, 0  # the last hidden state, and the context length it is for

    def start(self, prompt_ids, cache) -> None:
        self.calls, self.h, self.seen = 0, None, 0

    def accept(self, context, hidden) -> None:
        """Keep the hidden state that produced the last context token: the heads read it."""
        self.h, self.seen = hidden[-1], len(context)

    def greedy_vocab(self, ids) -> None:
        """Draft over the token ids `ids` alone at temperature 0 (vocab.py: a greedy vocabulary;
        None: the draft vocabulary there too)."""
        self.greedy_head = None if ids is None else DraftVocab(self.target, ids,
                                                                 "medusa greedy_vocab")

    def guesses(self, head=None):
        """Each head's logits from the last hidden state -> [K, V] (host), over the rows of
        `head` (a DraftVocab; default the draft vocabulary's)."""
        xp, h = self.target.xp, self.h
        z = xp.stack([h + silu(xp, linear(h[None], w, b)[0]) for w, b in self.heads])  # [K, D]
        return (self.draft_head if head is None else head)(z)  # [K, V]

    def propose(self, context, gamma, warp, rng) -> Draft:
        levels = self.shape[:gamma]
        if self.h is None or self.seen != len(context) or not levels:
            return self.empty_draft()  # first round: no hidden state yet
        logits = self.guesses(cut_for(warp, self.draft_head, self.greedy_head))
        probs = warp(logits)  # [K, V]: each head's distribution
        tokens, parents, q = [], [], []
        frontier = [-1]
        mode = sibling_mode(probs[0])
        for d, k in enumerate(levels):
            first = len(tokens)
            for node in frontier:  # head d+1's candidates under every node of depth d
                for x in children(logits[d], probs[d], k, mode, rng):
                    tokens.append(x)
                    parents.append(node)
                    q.append(probs[d])
            frontier = list(range(first, len(tokens)))
        return Draft(np.array(tokens, dtype=np.int64), np.array(q), np.array(parents), mode)


def load_medusa(path, target, shape=None) -> MedusaDrafter:
    """Medusa heads from a directory (config.json + model.safetensors) for `target`."""
    path = Path(path)
    cfg, st_file = read_head_dir(path, "a Medusa heads")
    cfg_file = path / "config.json"
    K, D = cfg.get("medusa_num_heads"), cfg.get("hidden_size")
    for name, value in (("medusa_num_heads", K), ("hidden_size", D)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
            raise MinispecError(f"{cfg_file}: field {name!r} should be a positive integer, got "
                                f"{value!r:.60}")
    if K > 16 or D != target.config.hidden_size:
        raise MinispecError(f"{cfg_file}: expected at most 16 heads of width "
                            f"{target.config.hidden_size} (the target's), got {K} of {D}")
    st = SafetensorsFile(st_file)
    heads = []
    for k in range(K):
        w, b = f"medusa_head.{k}.weight", f"medusa_head.{k}.bias"
        for name in (w, b):
            if name not in st:
                raise MinispecError(f"{path / 'model.safetensors'}: tensor {name!r} is missing")
        heads.append((st.get(w).astype(np.float32), st.get(b).astype(np.float32)))
    for k, (w, b) in enumerate(heads):
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise MinispecError(f"{path / 'model.safetensors'}: medusa head {k} holds NaN or "
                                "infinite values")
    as_stored = as_stored_heads(st, target)  # the heads' matrices as stored (F16, BF16), or None
    if as_stored is not None:
        heads = [(as_stored(w), b) for w, b in heads]
    return MedusaDrafter(target, heads, shape, read_draft_vocab(st, cfg, cfg_file))


def random_medusa(target, n_heads: int = 4, *, seed: int = 0, scale: float = 0.1,
                  shape=None) -> MedusaDrafter:
    """Random heads (for tests): not trained, but every code path runs."""
    rng = np.random.default_rng(seed)
    D = target.config.hidden_size
    heads = [(rng.normal(0, scale, (D, D)), rng.normal(0, scale, D)) for _ in range(n_heads)]
    return MedusaDrafter(target, heads, shape)
