"""The CPU speed path: a decode or verify step with each small piece of a block as one numba loop.

Skippable: the teaching path is model.py, and this file computes the same function. A decode
step of the shipped target is 26 weight products and, between them, some 250 small NumPy
operations (RMSNorm alone is eight: a cast, a square, a sum, a division, ...), each costing a
microsecond or more of Python and dispatch on arrays of a few hundred numbers: about a fifth of
the step, measured. Here RMSNorm, RoPE with the cache write and attention over the cache are one
compiled loop each (minispec/kernels.py), SiLU(gate) * up is one too (kernels.silu: tanh as a
rational function, which LLVM vectorizes, where numba's tanh is a call per number), and the
weight products are backend.matmul's few-rows kernel: the step of cuda_graphs.py
(`static_layers`, the same block as model.block with the positions given as data), with CPU
kernels. A Llama-shaped block (RMSNorm, RoPE, SwiGLU, no biases) runs those loops in one call
as far as its SiLU (kernels.block_front), and a model of such blocks runs all its layers in one
call (kernels.layers): the same arithmetic in the same order as piece by piece, so the same
bits, without Python between the pieces (the shipped target's step 1.15-1.2x faster than a
block a call, weights/README.md "Every layer in one call"); a batch's block is one call for
all its sequences (kernels.batch_front).

Every row's arithmetic is done alone, in the same order whatever the other rows are, so a verify
call of k tokens gives each token the logits a one-token step gives it, bit for bit, as the plain
path does; the values differ from the plain path's in the last bits (a sum's order), which
tests/test_cpu_steps.py bounds. `enable(model)` hangs the path on a model (the command line and
the benchmarks do it through `enable_where_supported`, as they turn on CUDA graphs on a GPU; a
model from minispec.load takes the plain path until then); calls of up to MAX_TOKENS tokens on
a cache, chains and trees, and batches of several sequences of up to MAX_TOKENS tokens each
(batch_forward.py's call) take it; prefill and everything else take the plain path, but on a
model of int8 activations, where every call on a cache takes it (CpuSteps.max_tokens).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from . import kernels
from .backend import (
    kept_for_int8,
    kernel_available,
    kernel_in_use,
    kernel_weight,
    matmul,
    tune_one_row,
)
from .core.model import Model
from .cuda_graphs import (
    PlainKernels,
    static_head,
    static_hidden,
    static_layers,
    tree_inputs,
    use,
)
from .errors import MinispecError

PRODUCTS = ("wqkv", "wo", "w_gate", "w_up", "w_down")  # a layer's weight matrices, in order
MAX_TOKENS = 32  # a call of more tokens (a prefill) takes the plain path: its overhead is small
_NO_TREE = np.zeros(0, np.uint32)  # the attention loop's tree bits when the call is a chain


class NumbaKernels(PlainKernels):
    """The pieces of a block as numba loops (minispec/kernels.py) over NumPy arrays, float32
    (weights float32 or kept 16-bit as stored, products by backend.matmul); a Llama-shaped block
    (RMSNorm, RoPE, SwiGLU, no biases) as one call of all of them (`block`)."""

    def __init__(self):
        super().__init__(np)
        self._k = kernels.compiled()
        self._weights = {}  # id(layer dict) -> (the dict, its weights as `block` reads them)

    def norm(self, x, w, b, eps):
        if b is not None:  # LayerNorm stays plain
            return super().norm(x, w, b, eps)
        y = np.empty_like(x)
        self._k.rms_norm(np.ascontiguousarray(x), w, np.float32(eps), y)
        return y

    def linear(self, x, w, b=None, res=None):
        y = matmul(x, w)
        if b is not None:
            y += b
        if res is not None:
            y += res
        return y

    def rope_store(self, qkv, tables, k_cache, v_cache, positions, n_heads, n_kv, slots=None):
        if tables is None:
            return super().rope_store(qkv, tables, k_cache, v_cache, positions, n_heads, n_kv,
                                      slots)
        self._k.rope_store(qkv, tables[0], tables[1], k_cache, v_cache, positions,
                           positions if slots is None else slots, n_heads, n_kv)

    def attention(self, qkv, k_cache, v_cache, positions, n_heads, window, slots=None,
                  tree=None):
        t, _, e = qkv.shape
        out = np.empty((t, n_heads * e), dtype=np.float32)
        has_tree = tree is not None
        self._k.attention(qkv, k_cache, v_cache, positions,
                          positions if slots is None else slots,
                          tree if has_tree else _NO_TREE, has_tree, n_heads,
                          np.float32(1.0 / math.sqrt(e)), window or 0, out)
        return out

    def mlp(self, x, p, res=None):
        if p["w_gate"] is None or p.get("b_gate") is not None or p["b_up"] is not None:
            return super().mlp(x, p, res)  # GPT-2's GELU, Granite's biases: plain
        gate = self.silu_mul(matmul(x, p["w_gate"]), matmul(x, p["w_up"]))  # [T, F]
        return self.linear(gate, p["w_down"], p["b_down"], res=res)

    def silu_mul(self, gate, up):
        """silu(gate) * up in place in gate (kernels.silu: model.silu's arithmetic, tanh a
        rational function, vectorized) -> gate."""
        self._k.silu(gate, up)
        return gate

    def block(self, x, p, config, tables, k_cache, v_cache, positions, slots=None, tree=None):
        w = self._block_weights(p, tables)
        if w is None or not kernel_in_use():  # biases, LayerNorm, GELU, no RoPE; the products
            # sent to NumPy (backend.use_kernel(False)): piece by piece
            return super().block(x, p, config, tables, k_cache, v_cache, positions, slots, tree)
        has_tree = tree is not None
        h, gate, up = self._k.block_front(  # x + attn, the MLP's gate and up products
            np.ascontiguousarray(x), *w, np.float32(config.norm_eps), tables[0], tables[1],
            k_cache, v_cache, positions, positions if slots is None else slots,
            tree if has_tree else _NO_TREE, has_tree, config.n_heads, config.n_kv_heads,
            np.float32(1.0 / math.sqrt(config.head_dim)), config.sliding_window or 0)
        return self.linear(self.silu_mul(gate, up), p["w_down"], res=h)  # h + mlp

    def batch_block(self, x, p, config, tables, bounds, k_caches, v_caches, layer, positions):
        """`block` for B sequences' rows laid end to end (rows bounds[b]..bounds[b+1] - 1 are
        sequence b's) in one call of kernels.batch_front: k_caches, v_caches are numba lists of
        each sequence's cache arrays [L, K, S_max, E], `layer` the one this block writes. Only
        for a layer `_block_weights` serves."""
        h, gate, up = self._k.batch_front(
            np.ascontiguousarray(x), bounds, *self._block_weights(p, tables),
            np.float32(config.norm_eps), tables[0], tables[1], k_caches, v_caches, layer,
            positions, config.n_heads, config.n_kv_heads,
            np.float32(1.0 / math.sqrt(config.head_dim)), config.sliding_window or 0)
        return self.linear(self.silu_mul(gate, up), p["w_down"], res=h)  # h + mlp

    def _block_weights(self, p, tables):
        """A Llama-shaped layer's norms and weights as kernels.block_front reads them (made once per
        layer; a weight read as GGUF blocks as its blocks' tiles), or None for any other layer."""
        seen = self._weights.get(id(p))
        if seen is None or seen[0] is not p:
            plain = (all(p.get(b) is None for b in ("attn_norm_b", "bqkv", "bo", "mlp_norm_b",
                                                     "b_gate", "b_up", "b_down"))
                     and all(p[n] is not None and p[n].T.flags.c_contiguous for n in PRODUCTS))
            w = None
            if plain:
                wqkv, wo, gate, up = (kernel_weight(p[n]) for n in PRODUCTS[:4])
                w = (p["attn_norm_w"], wqkv, wo, p["mlp_norm_w"], gate, up, p["w_up"].shape[1])
            seen = self._weights[id(p)] = (p, w)
        return seen[1] if tables is not None else None


class _BatchKernels:
    """NumbaKernels for B sequences' rows laid end to end (rows bounds[b]..bounds[b+1] are
    sequence b's): norms and products over every row at once, RoPE with the cache write and
    attention sequence by sequence, on that sequence's own caches (k_cache, v_cache: lists).
    For the blocks NumbaKernels.batch_block does not take (biases, LayerNorm, GELU)."""

    def __init__(self, kernels, bounds):
        self.k, self.bounds = kernels, bounds
        self.norm, self.linear, self.mlp = kernels.norm, kernels.linear, kernels.mlp

    def _rows(self):
        return zip(self.bounds[:-1], self.bounds[1:])

    block = PlainKernels.block  # piece by piece (static_block), on these kernels

    def rope_store(self, qkv, tables, k_caches, v_caches, positions, n_heads, n_kv, slots=None):
        for (a, b), k_cache, v_cache in zip(self._rows(), k_caches, v_caches):
            self.k.rope_store(qkv[a:b], tables, k_cache, v_cache, positions[a:b], n_heads, n_kv)

    def attention(self, qkv, k_caches, v_caches, positions, n_heads, window, slots=None,
                  tree=None):
        return np.concatenate([
            self.k.attention(qkv[a:b], k_cache, v_cache, positions[a:b], n_heads, window)
            for (a, b), k_cache, v_cache in zip(self._rows(), k_caches, v_caches)])


def supported(model) -> str | None:
    """Why the CPU step cannot serve this model, or None when it can."""
    if model.device != "cpu":
        return f"the CPU step needs a model on the CPU, got {model.device!r}"
    if np.dtype(model.dtype) != np.float32:
        return f"the CPU step computes float32, got {model.dtype}"
    if not kernel_available():
        return "the CPU step needs numba (pip install numba)"
    if model.config.head_dim % 2:
        return f"head_dim {model.config.head_dim}: RoPE needs an even head dim"
    if model.weights["layers"][0].get("q_norm_w") is not None:
        return "the CPU step has no RMSNorm of each query and key head (Qwen3)"
    return None


class CpuSteps:
    """Model.run_layers (every layer: Model.hidden_states reaches it too), Model.lm_head and a
    tree's call (minispec.tree.hidden_tree) for calls of 1..MAX_TOKENS tokens on a cache, by
    `static_layers` with NumbaKernels; None where it does not serve (the caller then takes the
    plain path). What FastModel asks of a speed path (cuda_graphs.StepGraphs serves
    hidden_states in place of run_layers)."""

    def __init__(self, model):
        why = supported(model)
        if why is not None:
            raise MinispecError(f"cpu_steps: {why}")
        self.model = model
        self.kernels = NumbaKernels()
        self._lists = False  # _layer_lists: False until made, None where it cannot
        # a model of int8 activations (backend.keep_blocks) takes this path for calls of every
        # length: its products quantize each row, so a prefill on the plain path, whose norms
        # and attention differ in the last bits, could round an activation the other way and
        # move a logit by far more; here every row gets one arithmetic, whatever the call
        self.max_tokens = (2**31 if any(kept_for_int8(p["wqkv"]) for p in model.weights["layers"])
                           else MAX_TOKENS)

    def new_cache(self, max_len=None):
        return Model.new_cache(self.model, max_len)  # a plain cache: nothing is captured

    def _tables(self, top: int) -> None:
        m = self.model
        if m._inv_freq is not None and top > m._rope_len:
            m._grow_rope(top)

    def run_layers(self, h, cache, pos: int, first: int = 0, end: int | None = None):
        m, t = self.model, h.shape[0]
        if cache is None and pos == 0 and self.max_tokens > MAX_TOKENS:
            cache = m.new_cache(t)  # int8 activations: Model.logits, a fresh sequence, too
        if (cache is None or first != 0 or end not in (None, m.n_layers)
                or not 1 <= t <= self.max_tokens):
            return None  # partial stacks (early exit), no cache, prefills: the plain path
        m._check_span(pos, t, cache)
        self._tables(pos + t)
        positions = np.arange(pos, pos + t, dtype=np.int64)
        return self._layers(h, positions, cache, positions, _NO_TREE)

    def _layers(self, h, positions, cache, slots, tree):
        """Every layer (static_layers' arguments; tree: the bits or _NO_TREE): one numba call
        (kernels.layers) where every layer is Llama-shaped, else static_layers' call a layer."""
        layers, m = self._layer_lists(), self.model
        if layers is None or not kernel_in_use():
            return static_layers(m, self.kernels, h, positions, cache,
                                 None if slots is positions else slots,
                                 tree if tree.shape[0] else None)
        c = m.config
        return self.kernels._k.layers(
            np.ascontiguousarray(h), *layers, np.float32(c.norm_eps), m._cos, m._sin, cache.k,
            cache.v, positions, slots, tree, tree.shape[0] > 0, c.n_heads, c.n_kv_heads,
            np.float32(1.0 / math.sqrt(c.head_dim)), c.sliding_window or 0)

    def lm_head(self, h):
        if not 1 <= h.shape[0] <= self.max_tokens:
            return None
        return static_head(self.model, self.kernels, h)

    def batch_layers(self, h, caches, starts, sizes):
        """Every layer for B sequences (batch_forward.batch_run_layers): rows h [N, D], sequence
        b's sizes[b] rows at positions starts[b].. on caches[b], laid end to end. Norms, weight
        products and the MLP see all N rows; RoPE with the cache write and attention go sequence
        by sequence: for a model of Llama-shaped blocks inside one numba call
        (kernels.batch_layers; one a layer, `NumbaKernels.batch_block`, where the layers'
        weights are of mixed types), else one call per sequence and layer. None when a sequence
        feeds more than MAX_TOKENS tokens. The caller has checked that every span fits its
        cache."""
        m = self.model
        if not sizes or max(sizes) > self.max_tokens or min(sizes) < 1:
            return None
        self._tables(max(p + t for p, t in zip(starts, sizes)))
        positions = np.concatenate([np.arange(p, p + t, dtype=np.int64)
                                    for p, t in zip(starts, sizes)])
        bounds = np.cumsum([0, *sizes])
        tables = None if m._inv_freq is None else (m._cos, m._sin)
        blocks, one = m.weights["layers"], self.kernels
        if kernel_in_use() and all(one._block_weights(p, tables) is not None for p in blocks):
            k_caches, v_caches = (one._k.typed_list([getattr(c, kv) for c in caches])
                                  for kv in ("k", "v"))
            lists, c = self._layer_lists(), m.config
            if lists is not None:  # every layer in one call
                return one._k.batch_layers(
                    np.ascontiguousarray(h), bounds, *lists, np.float32(c.norm_eps), m._cos,
                    m._sin, k_caches, v_caches, positions, c.n_heads, c.n_kv_heads,
                    np.float32(1.0 / math.sqrt(c.head_dim)), c.sliding_window or 0)
            for i, p in enumerate(blocks):
                h = one.batch_block(h, p, m.config, tables, bounds, k_caches, v_caches, i,
                                    positions)
            return h
        kernels = _BatchKernels(self.kernels, bounds.tolist())
        layers = range(m.n_layers)  # static_layers reads cache.k[i]: here, every sequence's
        batch = SimpleNamespace(k=[[c.k[i] for c in caches] for i in layers],
                                v=[[c.v[i] for c in caches] for i in layers])
        return static_layers(m, kernels, h, positions, batch)

    def draft_chain(self, feed, cache, g: int, v: int, temperature: float = 0.0, rng=None,
                    vocab=None):
        """g drafts of this (draft) model in one numba call (kernels.draft_chain): the tokens
        `feed` at positions cache.length.., then each draft fed back in turn, the last one not
        -> (tokens [g] int64, logits [g, V_draft] float32: the last row of each step, q [g, v]
        float64 or None); cache.length grows by len(feed) + g - 1, as a ModelDrafter's g calls
        grow it. v: the ids sampled (a drafter's vocab_size; past V_draft q is 0). vocab: a
        drafters.vocab.DraftVocab of this model with ids (a draft vocabulary): only its rows of
        the LM head are computed, every other logit -inf and q 0. temperature 0: each token the
        argmax of its step's logits over the first min(v, V_draft) ids (the vocabulary's), q
        None; else q[s] = their softmax at that temperature, and tokens[s] drawn from it as
        sampling.sample draws, with the s-th of g uniforms taken from `rng` (a numpy Generator)
        once the call is sure to serve. None (nothing done, nothing drawn) where it does not
        serve: a block `_block_weights` does not take, weights of mixed types, an
        embedding not kept in float32, a sliding window, more than MAX_TOKENS tokens fed, a
        vocabulary with ids of v or more.
        What FusedModelDrafter calls."""
        m, t = self.model, len(feed)
        layers = self._layer_lists()
        cut = vocab is not None and vocab.ids is not None
        if (layers is None or not 1 <= t <= MAX_TOKENS or g < 1 or not kernel_in_use()
                or m.weights["embed"].dtype != np.float32
                or m.config.sliding_window is not None or (cut and vocab.ids[-1] >= v)):
            return None  # (a cut's id past v would have no column of q)
        ids = m._token_array(feed)
        pos = cache.length
        m._check_span(pos, t + g - 1, cache)
        self._tables(pos + t + g - 1)
        tokens = np.empty(g, dtype=np.int64)
        logits = np.full((g, m.vocab_size), -np.inf, dtype=np.float32) if cut else np.empty(
            (g, m.vocab_size), dtype=np.float32)
        cols = vocab.ids if cut else np.arange(min(v, m.vocab_size), dtype=np.int64)
        q = np.zeros((g, v if temperature > 0 else 0))  # ids past V_draft stay 0
        uniforms = rng.random(g) if temperature > 0 else np.zeros(0)  # the core loop's draws
        c = m.config
        self.kernels._k.draft_chain(
            ids, pos, m.weights["embed"], *layers, np.float32(c.norm_eps), m._cos, m._sin,
            cache.k, cache.v, c.n_heads, c.n_kv_heads, np.float32(1.0 / math.sqrt(c.head_dim)),
            0, m.weights["norm_w"], kernel_weight(vocab.w if cut else m.weights["lm_head"]),
            cols, int(cut), float(temperature), uniforms, tokens, logits, q)
        cache.length = pos + t + g - 1
        return tokens, logits, q if temperature > 0 else None

    def _layer_lists(self):
        """The per-layer weights of kernels.layers and draft_chain as numba lists (attention
        norms, wqkv, wo, MLP norms, gate, up, down) and the MLP's width, made once; None where
        a layer is not Llama-shaped or the layers' weights are of mixed types."""
        if self._lists is False:
            self._lists = None
            m, one = self.model, self.kernels
            w = m.weights
            tables = None if m._inv_freq is None else (m._cos, m._sin)
            blocks = [one._block_weights(p, tables) for p in w["layers"]]
            if (all(b is not None for b in blocks)
                    and w["pos_embed"] is None and w["norm_b"] is None):
                downs = [kernel_weight(p["w_down"]) for p in w["layers"]]
                lists = [[b[i] for b in blocks] for i in range(6)] + [downs]
                if all(len({(a.dtype, a.ndim) for a in arrays}) == 1 for arrays in lists):
                    self._lists = (*(one._k.typed_list(a) for a in lists), blocks[0][6])
        return self._lists

    def hidden_tree(self, ids, parents, m: int, cache):
        model, t = self.model, len(ids)
        if not 1 <= t <= MAX_TOKENS or model.config.sliding_window is not None:
            return None
        positions, bits = tree_inputs(model, parents, m, cache)  # checks the nodes fit
        self._tables(int(positions.max()) + 1)
        slots = np.arange(cache.length, cache.length + t, dtype=np.int64)
        w = model.weights
        if w["pos_embed"] is None and w["embed"].dtype == np.float32:
            h = self._layers(w["embed"][np.asarray(ids, dtype=np.int64)], positions, cache, slots,
                             bits)  # static_hidden's embedding, then _layers' call(s)
        else:
            h = static_hidden(model, self.kernels, np.asarray(ids, dtype=np.int64), positions,
                              cache, slots, bits)
        cache.length += m
        return h


def enable(model) -> CpuSteps:
    """Make the model's calls of a few tokens take the CPU step (see CpuSteps), and let its
    weights choose whether products of one row ask the memory ahead (backend.tune_one_row)."""
    steps = CpuSteps(model)
    use(model, steps)
    w = model.weights
    tune_one_row([layer.get(n) for layer in w["layers"] for n in PRODUCTS] + [w["lm_head"]])
    return steps


def enable_where_supported(*models) -> None:
    """The speed path for each model that one serves: CUDA graphs on the GPU
    (cuda_graphs.enable_where_supported), this file's step on the CPU; None entries and others
    left plain. What the command line and the benchmarks call after loading; minispec.use_speed_path
    for a script."""
    from .cuda_graphs import enable_where_supported as on_the_gpu

    on_the_gpu(*models)  # cuda_graphs.supported refuses a CPU model, as `supported` a GPU one
    for m in models:
        if m is not None and supported(m) is None:
            enable(m)
