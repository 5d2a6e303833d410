"""A batch's call through a CUDA graph: B sequences x k new tokens each, and what it costs.

Skippable, like cuda_graphs.py, whose step this is for a batch. The lesson's last point is that
speculation spends spare arithmetic: a verify call of k tokens costs about one step while the
step is bound by reading the weights, and a full batch has no arithmetic to spare. On the CPU
`minispec crossover` measures that with real batched decoding (minispec/batch.py). On a GPU
the plain CuPy path of a batch is ~1,000 launches a step, so the host, not the GPU, would set
every cost; here the batch's call is captured once as a graph (cuda_graphs.static_hidden with
`seq`: each row's sequence, whose own cache and position attention reads) and replayed.

The rows of a batch's call are B x k: the few-rows product serves them on the tensor cores
(float16) in blocks of 16 rows, the blocks that read the same weights running side by side (all
but the first find them in the L2 cache), each row summed as it would be alone. So the cost
t(B, k) stays one step's while the weights' bytes set it, and grows with the rows once the
arithmetic does: where that happens is where speculation stops paying, and `call_costs`
measures it.

    costs = call_costs(model, batch_sizes=(1, 4, 16, 64), ks=(1, 5))   # {B: {k: seconds}}

Tested on NumPy with cuda_graphs.PlainKernels against batch_forward.batch_hidden (each
sequence at its own position), on the GPU against the plain path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .core.model import Model
from .cuda_graphs import FusedKernels, record, replay_ms, static_head, static_hidden, supported
from .errors import MinispecError


@dataclass
class BatchCache:
    """The keys and values of B sequences: k, v [L, B, K, S_max, E] (each sequence's length is
    the caller's: the call takes its positions as data)."""

    k: Any
    v: Any


def new_batch_cache(model: Model, B: int, max_len: int) -> BatchCache:
    """Zeros for B sequences of up to max_len positions each."""
    c = model.config
    shape = (c.n_layers, B, c.n_kv_heads, max_len, c.head_dim)
    return BatchCache(model.xp.zeros(shape, dtype=model.dtype),
                      model.xp.zeros(shape, dtype=model.dtype))


def batch_rows(xp, B: int, k: int):
    """Each row's sequence and its offset from the sequence's first new position, for B
    sequences of k new tokens laid end to end -> (seq [B k], offset [B k]), int64."""
    return xp.repeat(xp.arange(B), k), xp.tile(xp.arange(k), B)


def static_batch_hidden(model, kernels, ids, starts, k: int, cache: BatchCache):
    """The batch's call: ids [B k] (sequence b's k tokens at rows b k..), starts [B] (each
    sequence's first new position, on the device) -> the last hidden states [B k, D]; writes
    each sequence's keys and values at its positions. Nothing is read back to the host."""
    seq, offset = batch_rows(model.xp, starts.shape[0], k)
    return static_hidden(model, kernels, ids, starts[seq] + offset, cache, seq=seq)


def call_costs(model, *, batch_sizes, ks, context: int = 64, repeats: int = 20) -> dict:
    """Seconds of one batch's call (the layers and the head over all B k rows), replayed as a
    CUDA graph, for each B in batch_sizes and k in ks: {B: {k: median seconds}}. Each sequence
    sits at position `context` (its cache holds that many positions). The GPU only."""
    why = supported(model)
    if why is not None:
        raise MinispecError(f"batch graphs: {why}")
    cp = model.xp
    if np.dtype(model.dtype) != np.float16 and max(batch_sizes) * max(ks) > 16:
        raise MinispecError("batch graphs: more than 16 rows a call need float16 (the "
                            "tensor-core product); use --dtype float16")
    kernels = FusedKernels(cp, model.dtype)
    max_len = context + max(ks)
    if model._inv_freq is not None and max_len > model._rope_len:
        model._grow_rope(max_len)
    pool, stream = cp.cuda.MemoryPool(), cp.cuda.Stream(non_blocking=True)
    rs = np.random.default_rng(0)
    out: dict[int, dict[int, float]] = {}
    for B in batch_sizes:
        cache = new_batch_cache(model, B, max_len)
        starts = cp.full(B, context, dtype=cp.int64)
        out[B] = {}
        for k in ks:
            ids = cp.asarray(rs.integers(0, model.vocab_size, B * k))

            def call():
                h = static_batch_hidden(model, kernels, ids, starts, k, cache)
                return static_head(model, kernels, h)

            graph, _ = record(cp, pool, stream, call)
            out[B][k] = replay_ms(cp, graph, stream, repeats) / 1e3
    return out
