"""The GPU speed path: a decode or verify step replayed as one CUDA graph of fused kernels.

Skippable: the teaching path is model.py, and this file computes the same function. On a GPU a
decode step of a 1B model is ~900 small kernels (RMSNorm alone is nine: a cast, a square, a sum,
...), and CuPy spends microseconds of Python on each launch: the launches, not the weight reads,
set the speed (measured on an H200: 18-30 ms a step, 2-3% of the memory floor). Two remedies,
both here:

  1. fewer kernels: each weight product, RMSNorm, RoPE with the cache write, attention over the
     cache, and SiLU(gate) * up are one kernel each (eight per layer);
  2. one launch: the step is captured once as a CUDA graph and replayed (1.5-1.7 ms: 36-39% of
     the floor on an H200, 50% on an H100), and so is the final norm with the LM head.

CuPy refuses cuBLAS calls while a stream is captured, so the weight products are this file's own
kernels, each reading every weight once for all the call's rows (the GPU form of
backend.few_rows_matmul): in float16 on the tensor cores (mma.sync), so a verify call of 5
tokens costs what one token does (H200: 0.98-1.00 one-token steps; 16 tokens 1.11-1.12); in
float32 one warp per output row with float multiply-adds, whose cost grows with the rows
(`python .ci/gpu_rows.py` times both on a 1B model's shapes). A graph replays fixed pointers
and shapes, so the step is written shape-static: the token ids and the first position live in
device buffers that the host fills before each replay, the new keys and values are written at
their positions, and attention reads the cache up to each query's position, read on the device.

`static_hidden` (and `static_head`) is that step on any xp with any kernels: tests run it on
NumPy with the plain functions of model.py (`PlainKernels`) against Model.hidden_states.
`StepGraphs` captures it on CuPy with `FusedKernels` and is what `enable(model)` hangs on the
model (a FastModel from then on): Model.hidden_states then replays a graph for every call of
1..max_tokens tokens (decode steps, chain
verify calls), minispec.tree.hidden_tree one for a tree's verify call of 1..max_tokens rows (its
shape given as data: the rows' positions and which rows each one sees), Model.lm_head one for
1..max_tokens rows, and all take the plain path for anything else (prefill, larger trees, trees
grown level by level, batches of several sequences).
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict

import numpy as np

from .core.model import KVCache, Model, attention, gelu_new, linear, mlp, norm, rope
from .errors import MinispecError
from .tree import tree_mask

# ------------------------------------------------------------------------------------------------
# the step, shape-static: no value is read back to the host, every shape depends on T and S_max


class PlainKernels:
    """The pieces of a block as model.py computes them (any xp): the reference."""

    def __init__(self, xp):
        self.xp = xp

    def norm(self, x, w, b, eps):
        return norm(x, w, b, eps)

    def linear(self, x, w, b=None, res=None):
        """x @ w (+ b) (+ res, the residual stream)."""
        y = linear(x, w, b)
        return y if res is None else res + y

    def rope_store(self, qkv, tables, k_cache, v_cache, positions, n_heads, n_kv, slots=None,
                   seq=None):
        """Rotate the q and k heads of qkv [T, H+2K, E] (q in place) by `positions` and write k,
        v into the caches [K, S_max, E] at `slots` (default: the positions; a tree's node i sits
        in slot base + i, at position base + depth(i)). tables: RoPE (cos, sin) [P, E/2], or
        None. seq [T]: the caches are a batch's, [B, K, S_max, E], and row r is sequence
        seq[r]'s (a batch's call, minispec/batch_graphs.py)."""
        n_rot = n_heads + n_kv
        slots = positions if slots is None else slots
        if tables is not None:
            qkv[:, :n_rot] = rope(self.xp, qkv[:, :n_rot], tables[0][positions],
                                  tables[1][positions])
        if seq is not None:  # [T, K, E] each, scattered to (sequence, head, slot)
            k_cache[seq, :, slots] = qkv[:, n_heads:n_rot]
            v_cache[seq, :, slots] = qkv[:, n_rot:]
            return
        k_cache[:, slots] = qkv[:, n_heads:n_rot].transpose(1, 0, 2)  # [K, T, E], scattered
        v_cache[:, slots] = qkv[:, n_rot:].transpose(1, 0, 2)

    def attention(self, qkv, k_cache, v_cache, positions, n_heads, window, slots=None,
                  tree=None, seq=None):
        """Attention of the T queries in qkv at `positions` (in `slots`, default the positions)
        over the cache up to each one's slot -> [T, H*E]. tree [T] uint32: row r sees, of the
        slots slots[0].. (this call's rows), those whose bit is set in tree[r]. seq: as in
        rope_store (each row against its own sequence's cache, one row at a time here)."""
        xp = self.xp
        if seq is not None:
            return xp.concatenate([self.attention(
                qkv[r:r + 1], k_cache[int(seq[r])], v_cache[int(seq[r])], positions[r:r + 1],
                n_heads, window) for r in range(qkv.shape[0])])
        slots = positions if slots is None else slots
        i, j = slots[:, None], xp.arange(k_cache.shape[1])[None, :]  # [T, 1], [1, S_max]
        mask = j <= i
        if window is not None:
            mask &= j > positions[:, None] - window
        if tree is not None:
            row = xp.clip(j - slots[0], 0, 31).astype(xp.uint32)  # [1, S_max]
            mask &= (j < slots[0]) | ((tree[:, None] >> row) & 1).astype(bool)
        return attention(xp, qkv[:, :n_heads], k_cache, v_cache, mask)

    def mlp(self, x, p, res=None):
        y = mlp(self.xp, x, p)
        return y if res is None else res + y

    def block(self, x, p, config, tables, k_cache, v_cache, positions, slots=None, tree=None,
              seq=None):
        """One block, static_block: the pieces above one after the other (a speed path may do
        them in one call)."""
        return static_block(self, x, p, config, tables, k_cache, v_cache, positions, slots, tree,
                            seq)


def static_block(kernels, x, p, config, tables, k_cache, v_cache, positions, slots=None,
                 tree=None, seq=None):
    """model.block with the positions on the device: x [T, D] -> [T, D]."""
    n_heads, n_kv, e = config.n_heads, config.n_kv_heads, config.head_dim
    xn = kernels.norm(x, p["attn_norm_w"], p["attn_norm_b"], config.norm_eps)
    qkv = kernels.linear(xn, p["wqkv"], p["bqkv"]).reshape(x.shape[0], n_heads + 2 * n_kv, e)
    extra = {} if seq is None else {"seq": seq}  # a batch's call (another's kernels may lack it)
    kernels.rope_store(qkv, tables, k_cache, v_cache, positions, n_heads, n_kv, slots, **extra)
    att = kernels.attention(qkv, k_cache, v_cache, positions, n_heads, config.sliding_window,
                            slots, tree, **extra)
    x = kernels.linear(att, p["wo"], p["bo"], res=x)  # x + attn
    return kernels.mlp(kernels.norm(x, p["mlp_norm_w"], p["mlp_norm_b"], config.norm_eps), p,
                       res=x)  # x + mlp


def static_hidden(model, kernels, ids, positions, cache, slots=None, tree=None, seq=None):
    """Model.hidden_states for T tokens `ids` at `positions` (device arrays, pos..pos+T-1) on
    `cache`, without reading anything back to the host; does not change cache.length. The RoPE
    tables must already cover cache.max_len positions (StepGraphs grows them before a capture).

    A tree call (minispec.tree.hidden_tree with done=0) gives `slots` (base..base+T-1, where the
    rows' keys go) apart from the positions (base + depth for a node) and `tree` [T] uint32, row
    r's bits set for the rows it sees (its ancestors and itself; a prefix row the rows before
    it): see the attention kernel. A batch's call gives `seq` [T], each row's sequence, and a
    cache whose arrays are [L, B, K, S_max, E] (minispec/batch_graphs.py)."""
    w = model.weights
    h = w["embed"][ids]  # [T, D]
    if w["pos_embed"] is not None:
        h = h + w["pos_embed"][positions]
    return static_layers(model, kernels, h, positions, cache, slots, tree, seq)


def static_layers(model, kernels, h, positions, cache, slots=None, tree=None, seq=None):
    """Every layer over input rows h [T, D] at `positions` (Model.run_layers, the positions as
    data; slots, tree and seq as in static_hidden) -> [T, D]."""
    w = model.weights
    tables = None if model._inv_freq is None else (model._cos, model._sin)  # [P, E/2] each
    for i in range(model.n_layers):
        extra = {} if seq is None else {"seq": seq}
        h = kernels.block(h, w["layers"][i], model.config, tables, cache.k[i], cache.v[i],
                          positions, slots, tree, **extra)
    return h


def static_head(model, kernels, h):
    """Model.lm_head (final norm, LM head, float32 logits) on `kernels`: h [T, D] -> [T, V]."""
    w = model.weights
    h = kernels.norm(h, w["norm_w"], w["norm_b"], model.config.norm_eps)  # [T, D]
    return kernels.linear(h, w["lm_head"]).astype("float32", copy=False)  # [T, V]


# ------------------------------------------------------------------------------------------------
# fused kernels (CUDA C, compiled by CuPy on first use). No cuBLAS: CuPy refuses cuBLAS calls
# while a stream is captured, and a decode step's products are matrix-vector products anyway,
# bound by reading the weights once, which the few-rows kernel below does for up to 16 rows.

_SOURCE = r"""
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// the sum (or max) of v over the block, returned to every thread; red holds 32 floats
__device__ float block_reduce(float v, float* red, bool is_max) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // red may still be read by a previous call; earlier shared writes land
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float init = is_max ? NEG_INF : 0.0f;
    float r = lane < n_warps ? red[lane] : init;
    return is_max ? warp_max(r) : warp_sum(r);
}

// 8 consecutive values from p (16-byte aligned) as floats
__device__ inline void load8(const __half* p, float* v) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __half22float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
__device__ inline void load8(const float* p, float* v) {
    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// acc[r] += this lane's share of (weight row wr) . (x row r), for rows r < t <= R: each weight
// is read once for all rows. A row's sum runs in the same order whatever t is, so a verify
// call's rows equal one-token steps bit for bit.
template <typename T, int R>
__device__ inline void dot_rows(const T* __restrict__ x, const T* __restrict__ wr, int t,
                                int d_in, float* acc) {
    int lane = threadIdx.x & 31;
    if ((d_in & 7) == 0) {  // 16-byte loads of 8 values
        for (int i = lane * 8; i < d_in; i += 256) {
            float wv[8];
            load8(wr + i, wv);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < t) {
                    float xv[8];
                    load8(x + (long long)r * d_in + i, xv);
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[r] += wv[k] * xv[k];
                }
            }
        }
    } else {
        for (int i = lane; i < d_in; i += 32) {
            float wv = float(wr[i]);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] += wv * float(x[(long long)r * d_in + i]);
        }
    }
}

// y [t, d_out] = x [t, d_in] w^T for w [d_out, d_in] (one output per row), + b [d_out] if has_b,
// + res [t, d_out] if has_res. One warp per output, t <= R.
template <typename T, int R>
__global__ void rows_matmul(const T* __restrict__ x, const T* __restrict__ w, const T* b,
                            const T* res, T* y, int t, int d_in, int d_out, int has_b,
                            int has_res) {
    int o = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (o >= d_out) return;  // the whole warp
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    dot_rows<T, R>(x, w + (long long)o * d_in, t, d_in, acc);
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < t) {
            float s = warp_sum(acc[r]);
            if ((threadIdx.x & 31) == 0) {
                if (has_b) s = float(T(s)) + float(b[o]);
                long long at = (long long)r * d_out + o;
                y[at] = has_res ? T(float(res[at]) + float(T(s))) : T(s);
            }
        }
    }
}

// SwiGLU's first half: y [t, d_out] = silu(x wg^T) * (x wu^T), both weights one output per row
template <typename T, int R>
__global__ void rows_swiglu(const T* __restrict__ x, const T* __restrict__ wg,
                            const T* __restrict__ wu, T* y, int t, int d_in, int d_out) {
    int o = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (o >= d_out) return;
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; r++) ag[r] = au[r] = 0.0f;
    dot_rows<T, R>(x, wg + (long long)o * d_in, t, d_in, ag);
    dot_rows<T, R>(x, wu + (long long)o * d_in, t, d_in, au);
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < t) {
            float g = float(T(warp_sum(ag[r]))), u = float(T(warp_sum(au[r])));
            if ((threadIdx.x & 31) == 0)
                y[(long long)r * d_out + o] = T(g * (0.5f * (1.0f + tanhf(0.5f * g))) * u);
        }
    }
}

// The float16 few-rows product on the tensor cores: y [t, d_out] = x [t, d_in] w^T (+ b) (+ res)
// for t <= 8 * NT rows and d_in a multiple of 32. A block of W warps computes 16 outputs: warp j
// takes the 32-wide k-chunks c with c % W == j and multiplies the 16 x 32 weight tile with the
// rows' 32 x 8 tile by two mma.sync m16n8k16 per 8 rows (float32 sums); the W warps' sums are
// then added in a fixed order. The FMA kernel above spends t multiply-adds and t loads of x per
// weight, so a call of 5 rows cost 2.8 one-row calls (H200); here the arithmetic is one
// instruction per 2,048 products and the weights' bytes set the time whatever t is.
// Fragments (PTX ISA, mma.m16n8k16): lane = 4 g + i; A holds rows g and g+8, B column g, each
// at k = 2i, 2i+1, 2i+8, 2i+9 of the 16, and the sums D rows g and g+8 at columns 2i, 2i+1. Any
// order of k serves if A and B share it, so each lane loads 8 consecutive k (16 bytes) per row
// and feeds them to two mma in the order that layout asks. A row's sums do not depend on the
// other rows: a verify call's rows equal one-token steps bit for bit.
__device__ inline void mma16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// this warp's share of the 16 x (8 NT) tile of sums for outputs o0.. (rows past d_out read row
// d_out - 1 and are never written; x rows past t count as zeros)
template <int NT, int W>
__device__ inline void mma_tile(const __half* __restrict__ x, const __half* __restrict__ w,
                                int o0, int d_out, int t, int d_in, float* acc) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, i = lane & 3;
    const __half* w_lo = w + (long long)min(o0 + g, d_out - 1) * d_in + 8 * i;
    const __half* w_hi = w + (long long)min(o0 + g + 8, d_out - 1) * d_in + 8 * i;
    const __half* xr[NT];
    bool live[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        live[n] = n * 8 + g < t;
        xr[n] = x + (long long)(live[n] ? n * 8 + g : 0) * d_in + 8 * i;
    }
#pragma unroll 4
    for (int k = warp * 32; k < d_in; k += 32 * W) {
        uint4 lo = *reinterpret_cast<const uint4*>(w_lo + k);
        uint4 hi = *reinterpret_cast<const uint4*>(w_hi + k);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            uint4 b = live[n] ? *reinterpret_cast<const uint4*>(xr[n] + k) : make_uint4(0, 0, 0, 0);
            mma16816(acc + 4 * n, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
            mma16816(acc + 4 * n, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
        }
    }
}

// each thread's sums into red [W warps x 32 lanes x 4 NT] (threadIdx.x = 32 warp + lane)
template <int NT>
__device__ inline void stash_tile(float* red, const float* acc) {
#pragma unroll
    for (int j = 0; j < 4 * NT; j++) red[threadIdx.x * 4 * NT + j] = acc[j];
}
// for thread e < 128 NT: the sum over the W warps of tile element e, in warp order, with its
// output o (from o0) and row r
template <int NT, int W>
__device__ inline float tile_sum(const float* red, int e, int* o, int* r) {
    int n = e / 128, lane = (e % 128) / 4, j = e % 4;
    *o = (lane >> 2) + 8 * (j >> 1);
    *r = n * 8 + 2 * (lane & 3) + (j & 1);
    float s = 0.0f;
    for (int wp = 0; wp < W; wp++) s += red[(wp * 32 + lane) * 4 * NT + 4 * n + j];
    return s;
}

// The block's outputs o0 = 16 blockIdx.y.., and rows r0 = 8 NT blockIdx.x..: a call of more
// than 16 rows (a batch's) takes a block per 16 rows along x, the fastest-running index, so the
// blocks that read the same 16 weight rows run together and all but the first find them in
// the L2 cache; each row's sums run in the same order whatever t is (rows equal rows alone).
template <int NT, int W>
__global__ void mma_matmul(const __half* __restrict__ x, const __half* __restrict__ w,
                           const __half* b, const __half* res, __half* y, int t, int d_in,
                           int d_out, int has_b, int has_res) {
    __shared__ float red[32 * W * 4 * NT];
    float acc[4 * NT];
#pragma unroll
    for (int j = 0; j < 4 * NT; j++) acc[j] = 0.0f;
    int o0 = blockIdx.y * 16, r0 = blockIdx.x * 8 * NT;
    mma_tile<NT, W>(x + (long long)r0 * d_in, w, o0, d_out, t - r0, d_in, acc);
    stash_tile<NT>(red, acc);
    __syncthreads();
    if (threadIdx.x >= 128 * NT) return;
    int o, r;
    float s = tile_sum<NT, W>(red, threadIdx.x, &o, &r);
    o += o0;
    r += r0;
    if (o >= d_out || r >= t) return;
    if (has_b) s = float(__half(s)) + float(b[o]);
    long long at = (long long)r * d_out + o;
    y[at] = has_res ? __half(float(res[at]) + float(__half(s))) : __half(s);
}

template <int NT, int W>
__global__ void mma_swiglu(const __half* __restrict__ x, const __half* __restrict__ wg,
                           const __half* __restrict__ wu, __half* y, int t, int d_in, int d_out) {
    __shared__ float red_g[32 * W * 4 * NT], red_u[32 * W * 4 * NT];
    float ag[4 * NT], au[4 * NT];
#pragma unroll
    for (int j = 0; j < 4 * NT; j++) ag[j] = au[j] = 0.0f;
    int o0 = blockIdx.y * 16, r0 = blockIdx.x * 8 * NT;
    x += (long long)r0 * d_in;
    mma_tile<NT, W>(x, wg, o0, d_out, t - r0, d_in, ag);
    mma_tile<NT, W>(x, wu, o0, d_out, t - r0, d_in, au);
    stash_tile<NT>(red_g, ag);
    stash_tile<NT>(red_u, au);
    __syncthreads();
    if (threadIdx.x >= 128 * NT) return;
    int o, r;
    float g = float(__half(tile_sum<NT, W>(red_g, threadIdx.x, &o, &r)));
    float u = float(__half(tile_sum<NT, W>(red_u, threadIdx.x, &o, &r)));
    o += o0;
    r += r0;
    if (o >= d_out || r >= t) return;
    y[(long long)r * d_out + o] = __half(g * (0.5f * (1.0f + tanhf(0.5f * g))) * u);
}

// RMSNorm of one row per block: y = T(x / sqrt(mean(x^2) + eps)) * w
template <typename T>
__global__ void rms_norm(const T* x, const T* w, T* y, int d, float eps) {
    __shared__ float red[32];
    const T* xr = x + (long long)blockIdx.x * d;
    T* yr = y + (long long)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float a = float(xr[j]);
        ss += a * a;
    }
    float r = sqrtf(block_reduce(ss, red, false) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        yr[j] = T(float(T(float(xr[j]) / r)) * float(w[j]));
}

// qkv [t, H+2K, e] at positions qpos: RoPE (tables cs, sn [P, e/2], if has_rope) on the q and k
// heads, q written back in place, k and v written to the caches kc, vc [K, s_max, e] in slots
// slot[r] (= qpos for a chain; a tree's node sits in slot base + r at position base + depth).
// With has_seq the caches are a batch's, [B, K, s_max, e], and row r is sequence seq[r]'s.
// One thread per (row, head, pair j < e/2).
template <typename T>
__global__ void rope_store(T* qkv, const T* cs, const T* sn, T* kc, T* vc,
                           const long long* qpos, const long long* slot, const long long* seq,
                           int has_seq, int t, int n_heads, int n_kv, int e, int s_max,
                           int has_rope) {
    int half = e / 2, n_all = n_heads + 2 * n_kv;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)t * n_all * half) return;
    int j = (int)(i % half);
    long long rest = i / half;
    int n = (int)(rest % n_all), r = (int)(rest / n_all);
    long long p = qpos[r];
    T* row = qkv + ((long long)r * n_all + n) * e;
    float x1 = float(row[j]), x2 = float(row[j + half]);
    if (has_rope && n < n_heads + n_kv) {
        float c = float(cs[p * half + j]), s = float(sn[p * half + j]);
        float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
        x1 = y1;
        x2 = y2;
    }
    if (n < n_heads) {
        row[j] = T(x1);
        row[j + half] = T(x2);
        return;
    }
    bool is_k = n < n_heads + n_kv;
    int kvh = is_k ? n - n_heads : n - n_heads - n_kv;
    long long b = has_seq ? seq[r] : 0;
    T* dst = (is_k ? kc : vc) + ((b * n_kv + kvh) * s_max + slot[r]) * e;
    dst[j] = T(x1);
    dst[j + half] = T(x2);
}

// attention of query row r (position qpos[r], in slot slot[r]) and head h over the keys in slots
// lo < j <= slot[r] of kv head h / (H/K) in the caches: out [t, H*e]. With has_tree, of the
// slots from slot[0] on (this call's rows) only those whose bit is set in tree[r] are seen (the
// row's ancestors and itself; a tree takes no window). With has_seq the caches are a batch's
// (see rope_store). One block per (h, r); blockDim a multiple of 32, >= e. Shared memory: s_max
// scores, e query values, blockDim partial sums.
template <typename T>
__global__ void cache_attention(const T* qkv, const T* kc, const T* vc, T* out,
                                const long long* qpos, const long long* slot,
                                const unsigned int* tree, int has_tree, const long long* seq,
                                int has_seq, int t, int n_heads, int n_kv, int e, int s_max,
                                float scale, int window) {
    extern __shared__ float sh[];
    __shared__ float red[32];
    float* sc = sh;
    float* qs = sh + s_max;
    float* part = qs + e;
    int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    int kvh = h / (n_heads / n_kv);
    long long p = qpos[r], lo = window > 0 ? p - window : -1, base = slot[0];
    unsigned int seen = has_tree ? tree[r] : 0u;  // (t <= 32 rows: one bit each)
    const T* q = qkv + ((long long)r * (n_heads + 2 * n_kv) + h) * e;
    long long cache_row = (has_seq ? seq[r] : 0) * n_kv + kvh;
    const T* K = kc + cache_row * s_max * e;
    const T* V = vc + cache_row * s_max * e;
    for (int d = tid; d < e; d += blockDim.x) qs[d] = float(q[d]);
    __syncthreads();
    int n = (int)slot[r] + 1;
    float m = NEG_INF;
    for (int j = tid; j < n; j += blockDim.x) {
        float s = NEG_INF;
        if (j > lo && (!has_tree || j < base || ((seen >> (int)(j - base)) & 1u))) {
            const T* kr = K + (long long)j * e;
            float a = 0.0f;
            for (int d = 0; d < e; d++) a += qs[d] * float(kr[d]);
            s = a * scale;
        }
        sc[j] = s;
        m = fmaxf(m, s);
    }
    m = block_reduce(m, red, true);
    float z = 0.0f;
    for (int j = tid; j < n; j += blockDim.x) {
        float w = sc[j] > NEG_INF ? expf(sc[j] - m) : 0.0f;
        sc[j] = w;
        z += w;
    }
    z = block_reduce(z, red, false);  // (its barriers make every sc[j] visible)
    int parts = blockDim.x / e, d = tid % e, k = tid / e;
    float acc = 0.0f;
    if (k < parts)
        for (int j = k; j < n; j += parts) acc += sc[j] * float(V[(long long)j * e + d]);
    part[tid] = acc;
    __syncthreads();
    if (tid < e) {
        float s = 0.0f;
        for (int k2 = 0; k2 < parts; k2++) s += part[k2 * e + tid];
        out[(long long)r * n_heads * e + (long long)h * e + tid] = T(s / z);
    }
}
"""

_ROWS = (1, 2, 4, 8, 16)  # the few-rows products are compiled for at most this many rows
_THREADS = 256
_MMA_WARPS = 16  # warps per block of the tensor-core product (one block per 16 outputs): 16
# beat 8 at every row count on an H200 (`python .ci/gpu_rows.py`, weights/gpu/rows.txt)
MAX_CACHE = 8192  # cache_attention keeps a row's scores in shared memory (48 KB)


def _kernel_names(t: str) -> list[str]:
    mma = ([f"mma_{k}<{n}, {_MMA_WARPS}>" for k in ("matmul", "swiglu") for n in (1, 2)]
           if t == "__half" else [])
    return ([f"rows_matmul<{t}, {r}>" for r in _ROWS] + [f"rows_swiglu<{t}, {r}>" for r in _ROWS]
            + [f"rms_norm<{t}>", f"rope_store<{t}>", f"cache_attention<{t}>"] + mma)


class FusedKernels(PlainKernels):
    """The same pieces as one CUDA kernel each, float32 or float16, no cuBLAS; LayerNorm and
    GPT-2's GELU stay plain CuPy (elementwise kernels and reductions, which capture fine)."""

    def __init__(self, cp, dtype):
        super().__init__(cp)
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float16):
            raise MinispecError(f"cuda_graphs: fused kernels compute float32 or float16, got "
                                f"{dtype}")
        t = "float" if dtype == np.float32 else "__half"
        names = _kernel_names(t)
        module = cp.RawModule(code=_SOURCE, options=("-std=c++17",), name_expressions=names)
        self._k = {n.replace(f"{t}, ", "").replace(f"<{t}>", "").replace(f", {_MMA_WARPS}>", ">"):
                   module.get_function(n) for n in names}  # "rows_matmul<4>", "mma_matmul<1>", ...
        self.mma = dtype == np.float16  # the tensor-core product, for d_in a multiple of 32
        self.mma_warps = _MMA_WARPS

    @staticmethod
    def _rows(t: int) -> int:
        if t > _ROWS[-1]:
            raise MinispecError(f"cuda_graphs: a float32 product takes at most {_ROWS[-1]} rows "
                                f"(float16's tensor-core product any number), got {t}")
        return next(r for r in _ROWS if r >= t)

    def _mma(self, kind: str, t: int, d_out: int, args) -> None:
        """The tensor-core product `kind` ("matmul" or "swiglu") for t rows: one block per 16
        outputs and (past 8 rows) per 16 rows."""
        nt = 1 if t <= 8 else 2
        self._k[f"mma_{kind}<{nt}>"]((-(-t // (8 * nt)), -(-d_out // 16)),
                                     (32 * self.mma_warps,), args)

    @staticmethod
    def _blocks(d_out: int) -> int:  # one warp per output
        return -(-d_out * 32 // _THREADS)

    def _weight(self, w):
        wt = w.T  # [out, in], one output per row (loader.py stores every weight so)
        if not wt.flags.c_contiguous:
            raise MinispecError("cuda_graphs: a weight is not stored one output per row")
        return wt

    def linear(self, x, w, b=None, res=None):
        x = self.xp.ascontiguousarray(x)
        if x.data.ptr % 16:  # the kernel's 16-byte loads
            x = x.copy()
        t, d_in = x.shape
        wt = self._weight(w)
        y = self.xp.empty((t, wt.shape[0]), dtype=x.dtype)
        args = (x, wt, x if b is None else b, x if res is None else self.xp.ascontiguousarray(res),
                y, np.int32(t), np.int32(d_in), np.int32(wt.shape[0]), np.int32(b is not None),
                np.int32(res is not None))
        if self.mma and d_in % 32 == 0:
            self._mma("matmul", t, wt.shape[0], args)
        else:
            self._k[f"rows_matmul<{self._rows(t)}>"]((self._blocks(wt.shape[0]),), (_THREADS,),
                                                     args)
        return y

    def norm(self, x, w, b, eps):
        if b is not None:  # LayerNorm
            return norm(x, w, b, eps)
        x = self.xp.ascontiguousarray(x)
        y = self.xp.empty_like(x)
        self._k["rms_norm"]((x.shape[0],), (_THREADS,),
                            (x, w, y, np.int32(x.shape[1]), np.float32(eps)))
        return y

    def rope_store(self, qkv, tables, k_cache, v_cache, positions, n_heads, n_kv, slots=None,
                   seq=None):
        t, n_all, e = qkv.shape  # qkv: the product's fresh output, C-contiguous
        n = t * n_all * (e // 2)
        cs, sn = tables if tables is not None else (qkv, qkv)
        self._k["rope_store"](((n + _THREADS - 1) // _THREADS,), (_THREADS,),
                              (qkv, cs, sn, k_cache, v_cache, positions,
                               positions if slots is None else slots,
                               positions if seq is None else seq, np.int32(seq is not None),
                               np.int32(t), np.int32(n_heads), np.int32(n_kv), np.int32(e),
                               np.int32(k_cache.shape[-2]), np.int32(tables is not None)))

    def attention(self, qkv, k_cache, v_cache, positions, n_heads, window, slots=None,
                  tree=None, seq=None):
        t, n_all, e = qkv.shape
        s_max = k_cache.shape[-2]
        out = self.xp.empty((t, n_heads * e), dtype=qkv.dtype)
        self._k["cache_attention"](
            (n_heads, t), (_THREADS,),
            (qkv, k_cache, v_cache, out, positions, positions if slots is None else slots,
             positions if tree is None else tree, np.int32(tree is not None),
             positions if seq is None else seq, np.int32(seq is not None), np.int32(t),
             np.int32(n_heads), np.int32((n_all - n_heads) // 2), np.int32(e), np.int32(s_max),
             np.float32(1.0 / math.sqrt(e)), np.int32(window or 0)),
            shared_mem=4 * (s_max + e + _THREADS))
        return out

    def mlp(self, x, p, res=None):
        if p["w_gate"] is None:  # GPT-2: GELU stays plain
            y = self.linear(x, p["w_up"], p["b_up"])
            return self.linear(gelu_new(self.xp, y), p["w_down"], p["b_down"], res=res)
        y = self._swiglu(x, p["w_gate"], p["w_up"])
        return self.linear(y, p["w_down"], p["b_down"], res=res)

    def _swiglu(self, x, w_gate, w_up):
        """silu(x @ w_gate) * (x @ w_up), one kernel."""
        x = self.xp.ascontiguousarray(x)
        if x.data.ptr % 16:
            x = x.copy()
        t, d_in = x.shape
        wg, wu = self._weight(w_gate), self._weight(w_up)
        y = self.xp.empty((t, wg.shape[0]), dtype=x.dtype)
        args = (x, wg, wu, y, np.int32(t), np.int32(d_in), np.int32(wg.shape[0]))
        if self.mma and d_in % 32 == 0:
            self._mma("swiglu", t, wg.shape[0], args)
        else:
            self._k[f"rows_swiglu<{self._rows(t)}>"]((self._blocks(wg.shape[0]),), (_THREADS,),
                                                     args)
        return y


def supported(model) -> str | None:
    """Why CUDA graphs cannot serve this model, or None when they can."""
    c = model.config
    if model.device != "gpu":
        return f"CUDA graphs need a model on the GPU, got {model.device!r}"
    if c.head_dim % 2 or c.head_dim > _THREADS:
        return f"head_dim {c.head_dim}: the fused attention takes even head dims up to {_THREADS}"
    if np.dtype(model.dtype) not in (np.float32, np.float16):
        return f"fused kernels compute float32 or float16, got {model.dtype}"
    layer = model.weights["layers"][0]
    if layer.get("q_norm_w") is not None:
        return "the fused step has no RMSNorm of each query and key head (Qwen3)"
    if layer.get("b_gate") is not None:
        return "the fused MLP has no biases (Granite's mlp_bias)"
    return None


def tree_inputs(model, parents, m: int, cache):
    """A tree call's inputs to static_hidden (minispec.tree.hidden_tree with m prefix tokens,
    done=0; its rows go to slots cache.length..): the rows' positions [T] and tree bits [T]
    uint32 (bit c of row r: row r sees row c). Checks that the nodes fit the cache."""
    pos, mask, first = tree_mask(model, parents, cache, m)  # first == cache.length
    t = len(pos)
    seen = mask[:, first:first + t].astype(np.uint32)  # [T, T]
    return pos, (seen << np.arange(t, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)


# ------------------------------------------------------------------------------------------------
# capture and replay


class _Graph:
    """One captured step: its graph, its input buffers and the output it writes (a tree call's
    graph has two more inputs: the rows' positions and their tree bits)."""

    def __init__(self, cache_k, graph, ids, start, h, pos=None, tree=None):
        self.cache_k, self.graph, self.ids, self.start, self.h = cache_k, graph, ids, start, h
        self.pos, self.tree = pos, tree


class _HeadGraph:
    """The captured head for T rows: its graph, its input h [T, D] and its logits [T, V]."""

    def __init__(self, graph, h, logits):
        self.graph, self.h, self.logits = graph, h, logits


class StepGraphs:
    """Model.hidden_states for 1..max_tokens tokens as replayed CUDA graphs, one per (cache, T), and
    (head=True) Model.lm_head for 1..max_tokens rows, one graph per T.

    A graph is captured the first time a cache sees a call of T tokens (a warm-up step, then the
    capture: the cost of a few steps), and replayed after that; the `max_graphs` most recently
    used are kept. The graphs' scratch memory comes from a private pool, so nothing else is ever
    handed memory a replay writes to.
    """

    def __init__(self, model, *, max_tokens: int = 16, max_graphs: int = 16, head: bool = True):
        why = supported(model)
        if why is not None:
            raise MinispecError(f"cuda_graphs: {why}")
        if not 1 <= max_tokens <= _ROWS[-1]:
            raise MinispecError(f"cuda_graphs: max_tokens must be in 1..{_ROWS[-1]}, got "
                                f"{max_tokens!r}")
        cp = model.xp
        self.model, self.cp = model, cp
        self.max_tokens, self.max_graphs = max_tokens, max_graphs
        self.kernels = FusedKernels(cp, model.dtype)
        self.pool = cp.cuda.MemoryPool()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()  # (id(cache.k), T[, "tree"])
        self.heads: dict[int, _HeadGraph] | None = {} if head else None  # T -> the head's graph
        self.captures = 0
        self._free: dict[tuple, list] = {}  # shape -> released (k, v) arrays, for new_cache

    def new_cache(self, max_len=None):
        """Model.new_cache, reusing the arrays of a cache that is gone: its graphs then serve
        the new one (a graph is tied to the arrays it was captured on)."""
        cache = Model.new_cache(self.model, max_len)  # fresh zeros, then reused arrays
        free = self._free.get(cache.k.shape)
        if free:
            cache.k, cache.v = free.pop()
        weakref.finalize(cache, self._free.setdefault(cache.k.shape, []).append,
                         (cache.k, cache.v))
        return cache

    def hidden_states(self, tokens, cache):
        """Model.hidden_states(tokens, cache) by a graph replay, or None where a graph does not
        serve (more than max_tokens tokens, or a cache longer than MAX_CACHE: the caller then
        takes the plain path)."""
        m, t, pos = self.model, len(tokens), cache.length
        if not 1 <= t <= self.max_tokens or cache.max_len > MAX_CACHE:
            return None
        ids = m._token_array(tokens)  # checked, on the device
        m._check_span(pos, t, cache)
        g = self._graph((id(cache.k), t), cache, lambda: self._capture(cache, ids))
        g.ids[...] = ids
        g.start.fill(pos)
        g.graph.launch()  # on the current stream, after the two writes above
        cache.length = pos + t
        return g.h.copy()  # the graph's output buffer is rewritten by its next replay

    def lm_head(self, h):
        """Model.lm_head(h) by a graph replay (one per T, the final norm and the LM head with the
        few-rows product), or None where a graph does not serve (more than max_tokens rows)."""
        t = h.shape[0]
        if self.heads is None or not 1 <= t <= self.max_tokens:
            return None
        g = self.heads.get(t)
        if g is None:
            g = self.heads[t] = self._capture_head(h)
        g.h[...] = h  # the graph's input buffer
        g.graph.launch()
        return g.logits.copy()  # rewritten by the next replay

    def _capture_head(self, h) -> _HeadGraph:
        self.cp.cuda.Device().synchronize()
        h_buf = self.cp.array(h, dtype=self.model.dtype, order="C")  # the input
        graph, logits = self._record(lambda: static_head(self.model, self.kernels, h_buf))
        return _HeadGraph(graph, h_buf, logits)

    def hidden_tree(self, ids, parents, m: int, cache):
        """minispec.tree.hidden_tree(model, ids[:m], ids[m:], parents, cache) (done=0) by a
        graph replay, or None where a graph does not serve (more than max_tokens rows, a sliding
        window, a cache longer than MAX_CACHE). One graph per (cache, T) serves every tree of T
        rows: the tree's shape is input, the rows' positions and which rows each one sees."""
        mdl, t = self.model, len(ids)
        if (not 1 <= t <= self.max_tokens or cache.max_len > MAX_CACHE
                or mdl.config.sliding_window is not None):
            return None
        pos, bits = tree_inputs(mdl, parents, m, cache)
        g = self._graph((id(cache.k), t, "tree"), cache,
                        lambda: self._capture(cache, self.cp.asarray(ids), pos, bits))
        g.ids.set(ids)
        g.pos.set(pos)
        g.tree.set(bits)
        g.start.fill(cache.length)  # the first slot written
        g.graph.launch()
        cache.length += m
        return g.h.copy()

    def _capture(self, cache, ids, pos=None, bits=None) -> _Graph:
        """Capture the step for `ids` (a chain at cache.length.., or with pos and bits a tree
        call whose rows go to slots cache.length..)."""
        cp, m, t = self.cp, self.model, int(ids.shape[0])
        if m._inv_freq is not None and cache.max_len > m._rope_len:
            m._grow_rope(cache.max_len)
        cp.cuda.Device().synchronize()  # the cache's earlier writes are done
        ids_buf = ids.copy()  # the inputs: rewritten before every replay
        start = cp.full((1,), cache.length, dtype=cp.int64)
        pos_buf = None if pos is None else cp.asarray(pos, dtype=cp.int64)
        tree_buf = None if bits is None else cp.asarray(bits, dtype=cp.uint32)

        def step():
            slots = start + cp.arange(t)
            if tree_buf is None:
                return static_hidden(m, self.kernels, ids_buf, slots, cache)
            return static_hidden(m, self.kernels, ids_buf, pos_buf, cache, slots, tree_buf)

        graph, h = self._record(step)
        return _Graph(cache.k, graph, ids_buf, start, h, pos_buf, tree_buf)

    def _graph(self, key, cache, capture) -> _Graph:
        """The graph for `key` on `cache`, captured by capture() if there is none (or it was
        captured on a cache now gone: an id can be reused); the max_graphs most recent kept."""
        g = self.graphs.get(key)
        if g is None or g.cache_k is not cache.k:
            g = self.graphs[key] = capture()
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        return g

    def _record(self, step):
        """record(step) on this object's pool and stream."""
        self.captures += 1
        return record(self.cp, self.pool, self.stream, step)


def record(cp, pool, stream, step, between=None):
    """Run step() once (a warm-up: compiles kernels, fills the private memory `pool`), then
    between() if given (to undo what the warm-up changed), then capture step() on `stream` ->
    (the graph, instantiated, and the output its replays write)."""
    with cp.cuda.using_allocator(pool.malloc), stream:
        step()
        if between is not None:
            between()
        stream.synchronize()
        stream.begin_capture()
        try:
            out = step()
        finally:
            graph = stream.end_capture()
        graph.upload(stream)  # instantiate now, not at the first replay
        stream.synchronize()
    return graph, out


def replay_ms(cp, graph, stream, repeats: int = 20) -> float:
    """The median milliseconds of `repeats` replays of `graph` on `stream` (CUDA events around
    each), after 3 untimed ones."""
    for _ in range(3):
        graph.launch(stream)
    times = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


class FastModel(Model):
    """A Model whose calls of a few tokens take a speed path (`fast_steps`: a StepGraphs, CUDA
    graphs on the GPU, or a cpu_steps.CpuSteps, numba loops on the CPU); everything the path does
    not serve takes the plain one. use() makes a Model one, in place: the model's own forward pass
    (minispec/core/model.py) knows nothing of either."""

    fast_steps = None

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """Model.new_cache, reusing a finished cache's arrays and their graphs."""
        if self.fast_steps is None:
            return super().new_cache(max_len)
        return self.fast_steps.new_cache(max_len)

    def lm_head(self, h, rows=None):
        """Model.lm_head, a replayed graph for a few rows."""
        if rows is None and self.fast_steps is not None:
            logits = self.fast_steps.lm_head(h)
            if logits is not None:
                return logits
        return super().lm_head(h, rows)

    def hidden_states(self, tokens, cache: KVCache):
        """Model.hidden_states, a replayed graph for a few tokens (the CPU step serves its
        run_layers call instead)."""
        serve = getattr(self.fast_steps, "hidden_states", None)
        if serve is not None:
            h = serve(tokens, cache)
            if h is not None:
                return h
        return super().hidden_states(tokens, cache)

    def run_layers(self, h, cache, pos: int, first: int = 0, end: int | None = None):
        """Model.run_layers, on the speed path where it serves the call (the CPU step: every
        layer, a few rows, on a cache; an EAGLE head's layer is fed so)."""
        serve = getattr(self.fast_steps, "run_layers", None)
        if serve is not None:
            out = serve(h, cache, pos, first, end)
            if out is not None:
                return out
        return super().run_layers(h, cache, pos, first, end)


def use(model, steps) -> None:
    """Serve `model`'s calls of a few tokens from `steps` (a StepGraphs or a CpuSteps; a FastModel
    from now on), or None: the plain path (a Model again)."""
    model.__class__ = Model if steps is None else FastModel
    model.fast_steps = steps


def enable(model, **kw) -> StepGraphs:
    """Make the model's calls of a few tokens replay CUDA graphs (see StepGraphs)."""
    use(model, StepGraphs(model, **kw))
    return model.fast_steps


def enable_where_supported(*models) -> None:
    """enable() each GPU model CUDA graphs can serve (None entries and others left plain)."""
    for m in models:
        if m is not None and supported(m) is None:
            enable(m)


def disable(model) -> None:
    """Back to the plain path."""
    use(model, None)
