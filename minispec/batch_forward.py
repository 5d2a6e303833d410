"""The forward pass for a batch of sequences: model.py's math, several sequences per call.

Each sequence sits at its own position with its own KV cache. Their new tokens are laid end to
end, N = sum of T_b rows, and go through every weight matrix together: one read of the weights
for the whole batch, which is what makes batching pay when a step is memory-bound. Attention
stays per sequence, against that sequence's own keys and values. model.py's one-sequence path
is the reference; tests/test_batch.py checks every sequence here against Model.logits.

Shapes as in model.py, plus B sequences and N = sum over b of T_b new tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import to_host
from .core.model import KVCache, Model, attention, causal_mask, linear, mlp, norm, qkv_heads


def batched_block(xp, x, p: dict[str, Any], config, rot, layer_caches, starts, sizes, masks):
    """model.block for B sequences at once. x [N, D]: sequence b's T_b rows follow b-1's.

    rot: (cos, sin) [N, E/2] or None; layer_caches: per sequence this layer's (k_cache,
    v_cache); starts: each sequence's first new position; sizes: its T_b; masks: its [T_b, S_b]
    mask or None. The projections and the MLP see all N rows; attention is per sequence.
    """
    n_heads, n_kv = config.n_heads, config.n_kv_heads
    qkv = qkv_heads(xp, x, p, config, rot)  # [N, D] -> [N, H+2K, E]: one matmul for the batch
    outs, i = [], 0
    for (k_cache, v_cache), pos, t, mask in zip(layer_caches, starts, sizes, masks):
        q = qkv[i:i + t, :n_heads]  # [T_b, H, E]
        k_cache[:, pos:pos + t] = qkv[i:i + t, n_heads:n_heads + n_kv].transpose(1, 0, 2)
        v_cache[:, pos:pos + t] = qkv[i:i + t, n_heads + n_kv:].transpose(1, 0, 2)
        outs.append(attention(xp, q, k_cache[:, :pos + t], v_cache[:, :pos + t], mask))
        i += t
    x = x + linear(xp.concatenate(outs), p["wo"], p["bo"])  # [N, H*E] -> [N, D]
    return x + mlp(xp, norm(x, p["mlp_norm_w"], p["mlp_norm_b"], config.norm_eps), p)


def batch_embed(model: Model, tokens: list[list[int]], starts: list[int]):
    """Embeddings of each sequence's new tokens at its positions, laid end to end -> [N, D]:
    model.embed's rows, gathered for every sequence at once."""
    if not tokens or any(len(t) == 0 for t in tokens):
        return model.xp.concatenate([model.embed(t, pos) for t, pos in zip(tokens, starts)])
    for t, pos in zip(tokens, starts):
        model._check_span(pos, len(t), None)
    ids = model._token_array(np.concatenate([to_host(t) for t in tokens]))  # [N]
    h = model.weights["embed"][ids]  # [N, D]
    if model.weights["pos_embed"] is not None:
        at = np.concatenate([np.arange(pos, pos + len(t)) for t, pos in zip(tokens, starts)])
        h = h + model.weights["pos_embed"][model.xp.asarray(at)]  # + [N, D]
    return h


def batch_run_layers(model: Model, h, caches: list[KVCache], starts: list[int],
                     sizes: list[int], first: int = 0, end: int | None = None):
    """Layers first..end-1 on h [N, D] for B sequences -> [N, D] (Model.run_layers for a
    batch). Writes each sequence's keys/values at its positions; lengths are left to the
    caller."""
    xp, config = model.xp, model.config
    end = model.n_layers if end is None else end
    for cache, pos, t in zip(caches, starts, sizes):
        model._check_span(pos, t, cache)
    serve = getattr(getattr(model, "fast_steps", None), "batch_layers", None)
    if serve is not None and first == 0 and end == model.n_layers:  # the CPU step (cpu_steps.py)
        out = serve(h, caches, starts, sizes)
        if out is not None:
            return out
    positions = np.concatenate([np.arange(pos, pos + t) for pos, t in zip(starts, sizes)])
    rot = model.rope_rows(positions)  # 2 x [N, E/2], or None
    window = config.sliding_window
    masks = [None if t == 1 and (window is None or pos < window)
             else causal_mask(xp, pos, t, pos + t, window) for pos, t in zip(starts, sizes)]
    for i in range(first, end):
        layer_caches = [(c.k[i], c.v[i]) for c in caches]
        h = batched_block(xp, h, model.weights["layers"][i], config, rot, layer_caches, starts,
                          sizes, masks)  # [N, D]
    return h


def batch_hidden(model: Model, tokens: list[list[int]], caches: list[KVCache]) -> list:
    """Model.hidden_states for B sequences in one call: feed tokens[b] at caches[b].length..,
    advance each cache -> the last hidden states, one [T_b, D] array per sequence."""
    if len(caches) == 1 and getattr(model, "fast_steps", None) is not None:  # a speed path
        return [model.hidden_states(tokens[0], caches[0])]
    starts = [c.length for c in caches]
    sizes = [len(t) for t in tokens]
    h = batch_run_layers(model, batch_embed(model, tokens, starts), caches, starts, sizes)
    for c, t in zip(caches, sizes):
        c.length += t
    return split(h, sizes)


def split(x, sizes: list[int]) -> list:
    """Rows of x [N, ...] back into one array per sequence, sizes[b] rows each."""
    ends = np.cumsum(sizes).tolist()
    return [x[end - n:end] for n, end in zip(sizes, ends)]


def batch_head(model: Model, hs: list, n_rows: list[int], warp=None) -> list:
    """The LM head on the last n_rows[b] rows of each sequence's hidden states, in one matmul
    -> one logits array [n_rows[b], V] per sequence; given `warp`, the probabilities it makes of
    them, every row warped in one call (warp works row by row: each row's own result)."""
    rows = model.xp.concatenate([h[h.shape[0] - n:] for h, n in zip(hs, n_rows)])  # [sum, D]
    logits = model.lm_head(rows)  # [sum, V]
    return split(logits if warp is None else warp(logits), n_rows)
