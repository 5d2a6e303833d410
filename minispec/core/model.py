"""The transformer forward pass as pure functions over `xp` (NumPy or CuPy), and the KV cache.

One decoder-only block serves every family: pre-norm attention and MLP sublayers on a residual
stream. Llama, Qwen2, Qwen3 and Mistral use RMSNorm, rotary position embeddings (RoPE) and a SwiGLU
MLP (Qwen3 also RMSNorms each query and key head); GPT-2 uses LayerNorm, learned position
embeddings and a GELU MLP. Weights arrive as plain dicts already mapped from the checkpoint
(minispec/loader.py), linear weights given as [in, out] so every projection is `x @ w` (through
backend.matmul, the one place a CPU speed trick lives: on the CPU a few rows go through a kernel
that reads each weight once for all of them).

Shapes, one notation throughout:
  T new tokens, S cached+new positions, S_max cache capacity, D model width, H query heads,
  K key/value heads, G = H/K query heads per kv head, E head dim, F ffn width, V vocab, L layers.
Names: `x` is the residual stream inside a block, `h` the hidden state between blocks (Model);
head counts are n_heads / n_kv (H / K in shapes); a layer's cache pair is (k_cache, v_cache).

The KV cache is preallocated, indexed by position (llama2.c's key_cache + pos): `KVCache.k[l]` is
[K, S_max, E]; position p of layer l lives at k[l, :, p]. Rolling back rejected draft tokens is
setting one integer, `length`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import matmul, memory_bytes, to_host
from ..config import ModelConfig
from ..errors import MinispecError
from ..rope_scaling import llama3_inv_freq, rope_attention_factor, yarn_inv_freq

DEFAULT_MAX_CACHE = 4096  # default cache length cap: a 128k-context config must not take gigabytes


# ------------------------------------------------------------------------------------------------
# the math: pure functions, parameters in, arrays out


def rms_norm(x, w, eps: float):
    """RMSNorm (Llama): x / rms(x) * w, the statistics in float32."""
    x32 = x.astype("float32", copy=False)
    ms = (x32 * x32).sum(axis=-1, keepdims=True) / x.shape[-1]  # [T, D] -> [T, 1]
    return (x32 / (ms + eps) ** 0.5).astype(x.dtype, copy=False) * w  # -> [T, D]


def layer_norm(x, w, b, eps: float):
    """LayerNorm (GPT-2): (x - mean) / std * w + b, the statistics in float32."""
    x32 = x.astype("float32")
    mu = x32.mean(axis=-1, keepdims=True)  # [T, D] -> [T, 1]
    var = ((x32 - mu) ** 2).mean(axis=-1, keepdims=True)  # -> [T, 1]
    return ((x32 - mu) / (var + eps) ** 0.5).astype(x.dtype) * w + b  # -> [T, D]


def norm(x, w, b, eps: float):
    """LayerNorm when there is a bias (GPT-2), RMSNorm otherwise."""
    return rms_norm(x, w, eps) if b is None else layer_norm(x, w, b, eps)


def linear(x, w, b=None):
    """x @ w (+ b); w is stored [in, out] (or is a transposed view: a tied LM head)."""
    y = matmul(x, w)  # [T, in] -> [T, out]; backend.matmul is `x @ w`, fast for a few CPU rows
    return y if b is None else y + b


def silu(xp, x):
    """x * sigmoid(x), written with tanh so large negative x cannot overflow exp."""
    return x * (0.5 * (1.0 + xp.tanh(0.5 * x)))


def gelu_new(xp, x):
    """GPT-2's GELU, tanh approximation."""
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """The E/2 RoPE inverse frequencies theta^(-2i/E), with linear, Llama 3 or YaRN scaling
    (float64)."""
    e = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, e, 2, dtype=np.float64) / e)  # [E/2]
    rs = config.rope_scaling or {"rope_type": "default"}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # refused below instead
        if rs["rope_type"] == "linear":
            inv = inv / rs["factor"]
        elif rs["rope_type"] == "llama3":
            inv = llama3_inv_freq(inv, rs)
        elif rs["rope_type"] == "yarn":
            inv = yarn_inv_freq(inv, rs, config.rope_theta)
        last = max(config.max_position_embeddings - 1, 1)  # cos(inf) is NaN: every logit would be
        angles_fit = np.isfinite(inv * last).all()  # inf and NaN frequencies stay so, too
    if not angles_fit:
        raise MinispecError(f"ModelConfig.rope_theta {config.rope_theta} with rope_scaling "
                            f"{config.rope_scaling}: the RoPE frequencies are not finite (or "
                            f"their angles at position {last}, max_position_embeddings - 1)")
    return inv


def rope_tables(inv_freq: np.ndarray, n: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * frequency, positions 0..n-1, times `scale` (YaRN's attention
    factor): two [n, E/2] float64 host arrays."""
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]  # [n, E/2]
    return scale * np.cos(angles), scale * np.sin(angles)


def rope(xp, x, cos, sin):
    """Rotate each (x[i], x[i + E/2]) pair by its angle (the HF "rotate_half" layout).

    x [T, N, E]; cos, sin [T, E/2].
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, E/2] -> [T, 1, E/2]
    return xp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)  # -> [T, N, E]


def causal_mask(xp, pos: int, t: int, s: int, window: int | None):
    """[T, S] bool, True where query pos+i may attend key j: j <= pos+i (and pos+i - j < window)."""
    i = xp.arange(pos, pos + t)[:, None]  # [T, 1]
    j = xp.arange(s)[None, :]  # [1, S]
    ok = j <= i
    if window is not None:
        ok &= j > i - window
    return ok


def attention(xp, q, k, v, mask):
    """Softmax(q k^T / sqrt(E)) v with grouped-query heads; the cache is not copied per head.

    q [T, H, E]; k, v [K, S, E]; mask [T, S] bool, or None when every query sees every key (one
    new token). Query head i reads kv head i // G: the G heads of a group and their T tokens form
    the G*T rows of one matmul against their kv head.
    """
    t, n_heads, e = q.shape
    n_kv, s = k.shape[0], k.shape[1]
    G = n_heads // n_kv
    q = q.reshape(t, n_kv, G, e).transpose(1, 2, 0, 3)  # [T, H, E] -> [K, G, T, E]
    q = q.reshape(n_kv, G * t, e)  # -> [K, G*T, E]
    scores = (q @ k.swapaxes(-1, -2)).astype("float32", copy=False)  # -> [K, G*T, S]
    scores = scores.reshape(n_kv, G, t, s)  # -> [K, G, T, S]
    scores *= 1.0 / math.sqrt(e)
    if mask is not None:
        scores = xp.where(mask, scores, -xp.inf)  # mask [T, S] broadcasts over [K, G]
    scores -= scores.max(axis=-1, keepdims=True)  # softmax over S, in place
    probs = xp.exp(scores, out=scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs.astype(v.dtype, copy=False).reshape(n_kv, G * t, s) @ v  # -> [K, G*T, E]
    return out.reshape(n_kv, G, t, e).transpose(2, 0, 1, 3).reshape(t, n_heads * e)  # -> [T, H*E]


def mlp(xp, x, p: dict[str, Any]):
    """SwiGLU (w_gate present) or GPT-2's GELU MLP. x [T, D] -> [T, F] -> [T, D]."""
    if p["w_gate"] is not None:  # biases only in Granite's
        hidden = (silu(xp, linear(x, p["w_gate"], p.get("b_gate")))
                  * linear(x, p["w_up"], p["b_up"]))  # [T, D] -> [T, F]
    else:
        hidden = gelu_new(xp, linear(x, p["w_up"], p["b_up"]))  # [T, D] -> [T, F]
    return linear(hidden, p["w_down"], p["b_down"])  # [T, F] -> [T, D]


def qkv_heads(xp, x, p: dict[str, Any], config: ModelConfig, rot):
    """The attention's inputs: norm, one projection for the queries, keys and values, Qwen3's
    RMSNorm over each query and key head, RoPE. x [T, D] -> [T, H+2K, E] (queries, keys, values).
    """
    n_heads, n_kv, e = config.n_heads, config.n_kv_heads, config.head_dim
    xn = norm(x, p["attn_norm_w"], p["attn_norm_b"], config.norm_eps)
    qkv = linear(xn, p["wqkv"], p["bqkv"])  # [T, D] -> [T, (H+2K)E]
    qkv = qkv.reshape(x.shape[0], n_heads + 2 * n_kv, e)  # -> [T, H+2K, E]
    if p.get("q_norm_w") is not None:  # Qwen3, before RoPE
        qkv[:, :n_heads] = rms_norm(qkv[:, :n_heads], p["q_norm_w"], config.norm_eps)  # [T, H, E]
        k = qkv[:, n_heads:n_heads + n_kv]  # [T, K, E]
        qkv[:, n_heads:n_heads + n_kv] = rms_norm(k, p["k_norm_w"], config.norm_eps)
    if rot is not None:  # the H query and K key heads, rotated in one call
        qkv[:, :n_heads + n_kv] = rope(xp, qkv[:, :n_heads + n_kv], *rot)
    return qkv


def block(xp, x, p: dict[str, Any], config: ModelConfig, rot, layer_cache, pos: int, mask):
    """One transformer block: x + attn(norm(x)), then + mlp(norm(.)). x [T, D] -> [T, D].

    p holds attn_norm_w/_b, wqkv [D, (H+2K)E], bqkv, q_norm_w and k_norm_w [E] (Qwen3, else
    None), wo [H*E, D], bo, mlp_norm_w/_b, w_gate [D, F] (None for GPT-2), b_gate, w_up [D, F],
    b_up, w_down [F, D], b_down; absent biases are None. rot is (cos, sin) [T, E/2] for RoPE or
    None; layer_cache is this layer's (k_cache, v_cache), each [K, S_max, E], or None: the T
    tokens then attend only to each other.
    """
    n_heads, n_kv = config.n_heads, config.n_kv_heads
    t = x.shape[0]
    qkv = qkv_heads(xp, x, p, config, rot)  # [T, D] -> [T, H+2K, E]
    q, k, v = qkv[:, :n_heads], qkv[:, n_heads:n_heads + n_kv], qkv[:, n_heads + n_kv:]
    k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [T, K, E] -> [K, T, E]
    if layer_cache is not None:
        k_cache, v_cache = layer_cache
        k_cache[:, pos:pos + t] = k
        v_cache[:, pos:pos + t] = v
        k, v = k_cache[:, :pos + t], v_cache[:, :pos + t]  # -> [K, S, E]
    x = x + linear(attention(xp, q, k, v, mask), p["wo"], p["bo"])  # [T, H*E] -> [T, D]
    return x + mlp(xp, norm(x, p["mlp_norm_w"], p["mlp_norm_b"], config.norm_eps), p)


# ------------------------------------------------------------------------------------------------
# the KV cache


@dataclass
class KVCache:
    """Keys and values of every layer at every position so far, preallocated to max_len positions.

    k, v: [L, K, S_max, E]. Positions 0..length-1 are valid; rollback(n) forgets the rest.
    """

    k: Any
    v: Any
    length: int = 0

    @property
    def max_len(self) -> int:
        """Positions the cache can hold."""
        return self.k.shape[2]

    def rollback(self, length: int) -> None:
        """Shrink to the first `length` positions (rejected draft tokens are forgotten)."""
        if not isinstance(length, (int, np.integer)) or not 0 <= length <= self.length:
            raise MinispecError(f"KVCache.rollback: length must be an integer in 0..{self.length} "
                                f"(the current length), got {length!r}")
        self.length = int(length)


# ------------------------------------------------------------------------------------------------
# the model


class Model:
    """A loaded (or random) transformer: weights on the device and the forward pass over them.

    `weights` is {"embed": [V, D], "pos_embed": [P, D] | None, "norm_w": [D], "norm_b": [D] |
    None, "lm_head": [D, V], "layers": [ {per-layer dict, see block()} ] * L}, already in the
    compute dtype and on the device of `xp`.
    """

    def __init__(self, config: ModelConfig, weights: dict[str, Any], *, xp, device: str,
                 dtype, tokenizer=None, name: str = "model"):
        self.config = config
        self.weights = weights
        self.xp = xp
        self.device = device
        self.dtype = np.dtype(dtype)
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = config.vocab_size
        self.n_layers = config.n_layers
        self._inv_freq = rope_inv_freq(config) if config.family != "gpt2" else None
        self._rope_scale = rope_attention_factor(config)
        self._cos = self._sin = None
        self._rope_len = 0
        if self._inv_freq is not None:
            self._grow_rope(min(config.max_position_embeddings, DEFAULT_MAX_CACHE))

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.name!r}, {c.family}, L={c.n_layers}, D={c.hidden_size}, "
                f"V={c.vocab_size}, {self.device}, {self.dtype})")

    def _grow_rope(self, n: int) -> None:
        # tables for positions 0..n-1; grown on demand (each entry depends only on its position)
        n = min(max(n, 2 * self._rope_len), self.config.max_position_embeddings)
        cos, sin = rope_tables(self._inv_freq, n, self._rope_scale)
        self._cos = self.xp.asarray(cos.astype(self.dtype))
        self._sin = self.xp.asarray(sin.astype(self.dtype))
        self._rope_len = n

    def rope_rows(self, positions):
        """(cos, sin) [T, E/2] for an int array of T positions (any order), or None for a model
        without RoPE. For callers that lay tokens out other than pos..pos+T-1 (batches, trees)."""
        if self._inv_freq is None:
            return None
        top = int(positions.max()) + 1 if len(positions) else 0
        if top > self._rope_len:
            self._grow_rope(top)
        idx = self.xp.asarray(positions)
        return self._cos[idx], self._sin[idx]  # 2 x [T, E/2]

    # -- the cache ------------------------------------------------------------------------------

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty cache for up to max_len positions (default: the context, at most 4096)."""
        c = self.config
        if max_len is None:
            max_len = min(c.max_position_embeddings, DEFAULT_MAX_CACHE)
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
            raise MinispecError(f"new_cache: max_len must be a positive integer, got "
                                f"{max_len!r:.40}")
        if max_len > c.max_position_embeddings:
            raise MinispecError(f"new_cache: max_len {str(max_len)[:30]} exceeds the model's "
                                f"context length (max_position_embeddings="
                                f"{c.max_position_embeddings})")
        shape = (c.n_layers, c.n_kv_heads, int(max_len), c.head_dim)  # [L, K, S_max, E]
        nbytes = 2 * math.prod(shape) * self.dtype.itemsize  # keys and values
        if nbytes > memory_bytes(self.xp):
            raise MinispecError(f"new_cache: a KV cache of {int(max_len)} positions needs "
                                f"{nbytes / 2**30:.1f} GiB, more than this {self.device} has "
                                f"({memory_bytes(self.xp) / 2**30:.1f} GiB); ask for fewer "
                                "positions (max_new_tokens, or new_cache(max_len=...))")
        return KVCache(self.xp.zeros(shape, self.dtype), self.xp.zeros(shape, self.dtype))

    # -- the pieces of forward() ----------------------------------------------------------------

    def _token_array(self, tokens):
        ids = np.asarray(to_host(tokens) if not isinstance(tokens, (list, tuple)) else tokens)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise MinispecError(f"tokens: expected a non-empty 1-D sequence of integer token "
                                f"ids, got shape {ids.shape} dtype {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            raise MinispecError(f"tokens: ids must be in 0..{self.vocab_size - 1} (vocab_size),"
                                f" got {lo if lo < 0 else hi}")
        return self.xp.asarray(ids.astype(np.int64))

    def _check_span(self, pos: int, t: int, cache: KVCache | None) -> None:
        ctx = self.config.max_position_embeddings
        if pos < 0:
            raise MinispecError(f"pos must be >= 0, got {pos}")
        if pos + t > ctx:
            raise MinispecError(f"sequence of {pos + t} positions is longer than the context "
                                f"length (config max_position_embeddings={ctx})")
        if cache is not None and pos + t > cache.max_len:
            raise MinispecError(f"sequence of {pos + t} positions does not fit the KV cache "
                                f"(max_len={cache.max_len}; use new_cache(max_len=...))")

    def embed(self, tokens, pos: int):
        """Token (+ learned position) embeddings for tokens at positions pos..pos+T-1 -> [T, D]."""
        ids = self._token_array(tokens)
        self._check_span(pos, int(ids.shape[0]), None)
        h = self.weights["embed"][ids]  # [T] -> [T, D]
        if self.weights["pos_embed"] is not None:
            h = h + self.weights["pos_embed"][pos:pos + ids.shape[0]]  # + [T, D]
        return h

    def run_layers(self, h, cache: KVCache | None, pos: int, first: int = 0,
                   end: int | None = None):
        """Layers first..end-1 on h [T, D] at positions pos..pos+T-1 -> [T, D].

        Writes those layers' keys/values into `cache` at pos..pos+T-1 and attends over positions
        0..pos+T-1 of it; does not change cache.length (hidden_states() does). cache None: no cache,
        the T tokens attend only to each other (pos must then be 0).
        """
        end = self.n_layers if end is None else end
        if not 0 <= first <= end <= self.n_layers:
            raise MinispecError(f"run_layers: need 0 <= first <= end <= {self.n_layers}, got "
                                f"first={first}, end={end}")
        t = h.shape[0]
        if cache is None and pos != 0:
            raise MinispecError(f"run_layers: without a cache pos must be 0, got {pos}")
        self._check_span(pos, t, cache)
        if self._inv_freq is not None and pos + t > self._rope_len:
            self._grow_rope(pos + t)
        rot = (None if self._inv_freq is None
               else (self._cos[pos:pos + t], self._sin[pos:pos + t]))  # 2 x [T, E/2]
        window = self.config.sliding_window
        # one new token sees every position so far, unless a sliding window hides some: no mask
        mask = (None if t == 1 and (window is None or pos < window)
                else causal_mask(self.xp, pos, t, pos + t, window))  # [T, S]
        for i in range(first, end):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            h = block(self.xp, h, self.weights["layers"][i], self.config, rot, layer_cache, pos,
                      mask)  # [T, D] -> [T, D]
        return h

    def lm_head(self, h, rows=None):
        """Final norm and LM head: h [T, D] -> logits [T, V] float32 (on the device). rows:
        other head weights [D, N] to use instead (a draft vocabulary's rows, drafters/vocab.py)."""
        w = self.weights
        h = norm(h, w["norm_w"], w["norm_b"], self.config.norm_eps)  # [T, D]
        return linear(h, w["lm_head"] if rows is None else rows).astype(
            "float32", copy=False)  # [T, D] -> [T, V]

    # -- whole passes ---------------------------------------------------------------------------

    def hidden_states(self, tokens, cache: KVCache):
        """Feed T tokens at positions cache.length.., advance the cache -> the last hidden state
        h [T, D] (before the final norm: what Medusa heads and EAGLE read)."""
        pos = cache.length
        h = self.embed(tokens, pos)  # [T] -> [T, D]
        h = self.run_layers(h, cache, pos)  # [T, D]
        cache.length = pos + h.shape[0]
        return h

    def forward(self, tokens, cache: KVCache):
        """Feed T tokens at positions cache.length.., advance the cache -> logits [T, V] float32."""
        return self.lm_head(self.hidden_states(tokens, cache))  # [T, D] -> [T, V]

    def logits(self, token_ids) -> np.ndarray:
        """The reference: logits at every position of a fresh sequence, no cache -> host [n, V]."""
        h = self.run_layers(self.embed(token_ids, 0), None, 0)  # [n, D]
        return to_host(self.lm_head(h))  # [n, V]
