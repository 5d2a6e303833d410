"""The CPU speed path: a decode or verify step with each small piece of a block as one numba loop.

Skippable: the teaching path is model.py, and this file computes the same function. A decode
step of the shipped target is 26 weight products and, between them, some 250 small NumPy
operations (RMSNorm alone is eight: a cast, a square, a sum, a division, ...), each costing a
microsecond or more of Python and dispatch on arrays of a few hundred numbers: about a fifth of
the step, measured. Here RMSNorm, RoPE with the cache write and attention over the cache are one
compiled loop each, SiLU(gate) * up is done in place, and the weight products stay
backend.matmul's few-rows kernel: the step of cuda_graphs.py (`static_layers`, the same block as
model.block with the positions given as data), with CPU kernels.

Every row's arithmetic is done alone, in the same order whatever the other rows are, so a verify
call of k tokens gives each token the logits a one-token step gives it, bit for bit, as the plain
path does; the values differ from the plain path's in the last bits (a sum's order), which
tests/test_cpu_steps.py bounds. `enable(model)` hangs the path on a model (the command line and
the benchmarks do it through `enable_where_supported`, as they turn on CUDA graphs on a GPU; a
model from minispec.load takes the plain path until then); calls of up to MAX_TOKENS tokens on
a cache, chains and trees, and batches of several sequences of up to MAX_TOKENS tokens each
(batch_forward.py's call) take it; prefill and everything else take the plain path.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from .backend import kernel_available, matmul
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

MAX_TOKENS = 32  # a call of more tokens (a prefill) takes the plain path: its overhead is small


class NumbaKernels(PlainKernels):
    """The pieces of a block as numba loops over NumPy arrays, float32 (weights float32 or kept
    16-bit as stored, products by backend.matmul)."""

    def __init__(self):
        super().__init__(np)
        self._k = _compiled()

    def norm(self, x, w, b, eps):
        if b is not None:  # LayerNorm stays plain
            return super().norm(x, w, b, eps)
        y = np.empty_like(x)
        self._k["rms_norm"](np.ascontiguousarray(x), w, np.float32(eps), y)
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
        self._k["rope_store"](qkv, tables[0], tables[1], k_cache, v_cache, positions,
                              positions if slots is None else slots, n_heads, n_kv)

    def attention(self, qkv, k_cache, v_cache, positions, n_heads, window, slots=None,
                  tree=None):
        t, _, e = qkv.shape
        out = np.empty((t, n_heads * e), dtype=np.float32)
        has_tree = tree is not None
        self._k["attention"](qkv, k_cache, v_cache, positions,
                             positions if slots is None else slots,
                             tree if has_tree else _NO_TREE, has_tree, n_heads,
                             np.float32(1.0 / math.sqrt(e)), window or 0, out)
        return out

    def mlp(self, x, p, res=None):
        if p["w_gate"] is None or p.get("b_gate") is not None or p["b_up"] is not None:
            return super().mlp(x, p, res)  # GPT-2's GELU, Granite's biases: plain
        gate = matmul(x, p["w_gate"])  # [T, F]
        # silu(gate) * up as model.silu writes it, in place: the same operations in the same
        # order (the same bits), no temporaries; NumPy's tanh is vectorized, where a numba loop
        # calls tanhf once per number (2.6x slower on a row of the shipped target's MLP, 10x on
        # 16 rows)
        t = np.multiply(gate, 0.5)
        np.tanh(t, out=t)
        t += 1.0
        t *= 0.5
        np.multiply(gate, t, out=t)
        t *= matmul(x, p["w_up"])
        return self.linear(t, p["w_down"], p["b_down"], res=res)


class _BatchKernels:
    """NumbaKernels for B sequences' rows laid end to end (rows bounds[b]..bounds[b+1] are
    sequence b's): norms and products over every row at once, RoPE with the cache write and
    attention sequence by sequence, on that sequence's own caches (k_cache, v_cache: lists)."""

    def __init__(self, kernels, bounds):
        self.k, self.bounds = kernels, bounds
        self.norm, self.linear, self.mlp = kernels.norm, kernels.linear, kernels.mlp

    def _rows(self):
        return zip(self.bounds[:-1], self.bounds[1:])

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

    def new_cache(self, max_len=None):
        return Model.new_cache(self.model, max_len)  # a plain cache: nothing is captured

    def _tables(self, top: int) -> None:
        m = self.model
        if m._inv_freq is not None and top > m._rope_len:
            m._grow_rope(top)

    def run_layers(self, h, cache, pos: int, first: int = 0, end: int | None = None):
        m, t = self.model, h.shape[0]
        if cache is None or first != 0 or end not in (None, m.n_layers) or not 1 <= t <= MAX_TOKENS:
            return None  # partial stacks (early exit), no cache, prefills: the plain path
        m._check_span(pos, t, cache)
        self._tables(pos + t)
        return static_layers(m, self.kernels, h, np.arange(pos, pos + t, dtype=np.int64), cache)

    def lm_head(self, h):
        if not 1 <= h.shape[0] <= MAX_TOKENS:
            return None
        return static_head(self.model, self.kernels, h)

    def batch_layers(self, h, caches, starts, sizes):
        """Every layer for B sequences (batch_forward.batch_run_layers): rows h [N, D], sequence
        b's sizes[b] rows at positions starts[b].. on caches[b], laid end to end. Norms, weight
        products and the MLP see all N rows; RoPE with the cache write and attention are one
        numba call per sequence. None when a sequence feeds more than MAX_TOKENS tokens. The
        caller has checked that every span fits its cache."""
        m = self.model
        if not sizes or max(sizes) > MAX_TOKENS or min(sizes) < 1:
            return None
        self._tables(max(p + t for p, t in zip(starts, sizes)))
        positions = np.concatenate([np.arange(p, p + t, dtype=np.int64)
                                    for p, t in zip(starts, sizes)])
        kernels = _BatchKernels(self.kernels, np.cumsum([0, *sizes]).tolist())
        layers = range(m.n_layers)  # static_layers reads cache.k[i]: here, every sequence's
        batch = SimpleNamespace(k=[[c.k[i] for c in caches] for i in layers],
                                v=[[c.v[i] for c in caches] for i in layers])
        return static_layers(m, kernels, h, positions, batch)

    def hidden_tree(self, ids, parents, m: int, cache):
        model, t = self.model, len(ids)
        if not 1 <= t <= MAX_TOKENS or model.config.sliding_window is not None:
            return None
        positions, bits = tree_inputs(model, parents, m, cache)  # checks the nodes fit
        self._tables(int(positions.max()) + 1)
        slots = np.arange(cache.length, cache.length + t, dtype=np.int64)
        h = static_hidden(model, self.kernels, np.asarray(ids, dtype=np.int64), positions, cache,
                          slots, bits)
        cache.length += m
        return h


def enable(model) -> CpuSteps:
    """Make the model's calls of a few tokens take the CPU step (see CpuSteps)."""
    steps = CpuSteps(model)
    use(model, steps)
    return steps


def enable_where_supported(*models) -> None:
    """The speed path for each model that one serves: CUDA graphs on the GPU
    (cuda_graphs.enable_where_supported), this file's step on the CPU; None entries and others
    left plain. What the command line and the benchmarks call after loading."""
    from .cuda_graphs import enable_where_supported as on_the_gpu

    on_the_gpu(*models)  # cuda_graphs.supported refuses a CPU model, as `supported` a GPU one
    for m in models:
        if m is not None and supported(m) is None:
            enable(m)


# ------------------------------------------------------------------------------------------------
# the kernels: plain Python loops, compiled by numba on first use (cached on disk after that)

_KERNELS: dict | None = None
_NO_TREE = np.zeros(0, np.uint32)  # the attention kernel's tree bits when the call is a chain


def _compiled() -> dict:
    global _KERNELS
    if _KERNELS is None:
        import numba

        jit = numba.njit(fastmath=True, cache=True)
        _KERNELS = {"rms_norm": jit(_rms_norm), "rope_store": jit(_rope_store),
                    "attention": jit(_attention)}
    return _KERNELS


def _rms_norm(x, w, eps, y):  # pragma: no cover - runs compiled
    # y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w
    t, d = x.shape
    for r in range(t):
        ss = np.float32(0)
        for i in range(d):
            ss += x[r, i] * x[r, i]
        scale = np.float32(1) / np.sqrt(ss / d + eps)
        for i in range(d):
            y[r, i] = x[r, i] * scale * w[i]


def _rope_store(qkv, cos, sin, k_cache, v_cache, positions, slots, n_heads,
                n_kv):  # pragma: no cover - runs compiled
    # rotate the query and key heads of qkv [T, H+2K, E] in place (position positions[r]), then
    # write row r's keys and values into the caches [K, S_max, E] at slot slots[r]
    t, _, e = qkv.shape
    half = e // 2
    for r in range(t):
        p = positions[r]
        for h in range(n_heads + n_kv):
            for i in range(half):
                c, s = cos[p, i], sin[p, i]
                a, b = qkv[r, h, i], qkv[r, h, i + half]
                qkv[r, h, i] = a * c - b * s
                qkv[r, h, i + half] = b * c + a * s
        for h in range(n_kv):
            k_cache[h, slots[r]] = qkv[r, n_heads + h]
            v_cache[h, slots[r]] = qkv[r, n_heads + n_kv + h]


def _attention(qkv, k_cache, v_cache, positions, slots, tree, has_tree, n_heads, scale,
               window, out):  # pragma: no cover - runs compiled
    # row r, query head h (kv head h // G) attends to the slots j <= slots[r] it sees: with a
    # tree, of this call's slots (first..) only those whose bit is set in tree[r]; with a
    # sliding window, only j > positions[r] - window. Softmax over them, then the mean of values.
    t, _, e = qkv.shape
    g = n_heads // k_cache.shape[0]
    first = slots[0]
    scores = np.empty(slots.max() + 1, np.float32)
    acc = np.empty(e, np.float32)
    for r in range(t):
        top = slots[r]
        lo = max(positions[r] - window + 1, 0) if window > 0 else 0
        for h in range(n_heads):
            kv = h // g
            best = -np.inf
            for j in range(lo, top + 1):
                if has_tree and j >= first and not (tree[r] >> (j - first)) & 1:
                    scores[j] = -np.inf
                    continue
                s = np.float32(0)
                for i in range(e):
                    s += qkv[r, h, i] * k_cache[kv, j, i]
                scores[j] = s * scale
                best = max(best, scores[j])
            total = np.float32(0)
            for j in range(lo, top + 1):
                scores[j] = np.exp(scores[j] - best)
                total += scores[j]
            for i in range(e):
                acc[i] = 0
            for j in range(lo, top + 1):
                p = scores[j]
                if p != 0:
                    for i in range(e):
                        acc[i] += p * v_cache[kv, j, i]
            for i in range(e):
                out[r, h * e + i] = acc[i] / total
