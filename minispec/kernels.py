"""The CPU's compiled loops: the few-rows weight product (backend.matmul) and the pieces of a
decode or verify step (cpu_steps.py), plain Python compiled by numba on first use.

Skippable: each computes what a few lines of NumPy compute, and is tested against them (`x @ w`
in tests/test_backend.py; model.py's block in tests/test_cpu_steps.py). They share one file
because numba caches each compiled function on disk under the file that defines it: a loop
calling a loop from another file would keep the old machine code of that one after the other
file changed. `block_front` (a transformer block up to its MLP's SiLU, in one call) calls the
others.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

_KERNELS: SimpleNamespace | bool | None = None  # None: not compiled yet; False: no numba
_prefetch = _eight = _tail = _three = _widen = None  # numba functions the loops call
_one = _rows = _product = _norm = _rope = _attend = None


def compiled() -> SimpleNamespace | None:
    """The compiled loops (None without numba): product(x, wt, y, ahead), rms_norm,
    rope_store, attention and block_front, each named below without its underscore (and
    `ahead`, for the product's last argument). numba is imported on the first call, not with
    minispec; the machine code comes from numba's cache (cache=True) after the first run on a
    machine."""
    global _KERNELS, _prefetch, _eight, _tail, _three, _widen, _one, _rows, _product, _norm
    global _rope, _attend
    if _KERNELS is None:
        try:
            import numba
        except ImportError:
            _KERNELS = False
            return None
        jit = numba.njit(fastmath=True, cache=True)
        _widen, _prefetch = _widen_intrinsic(numba), _prefetch_intrinsic(numba)
        _eight, _tail = _in_pairs(jit(_eight_rows_kernel)), jit(_tail_kernel)
        _three = _in_pairs(jit(_three_rows_kernel))
        _one, _rows = _in_pairs(jit(_one_row_kernel)), _in_pairs(jit(_rows_kernel))
        _product = jit(_product_kernel)
        _norm, _rope, _attend = jit(_rms_norm), jit(_rope_store), jit(_attention)
        _KERNELS = SimpleNamespace(product=_product, rms_norm=_norm, rope_store=_rope,
                                   attention=_attend, block_front=jit(_block_front),
                                   ahead=ahead)
    return _KERNELS or None


def ahead(dtype, t: int) -> int:
    """The `ahead` argument of the product for t rows of a weight of this dtype: > 0 sends the
    rows loop's prefetches of a line through a loop whose count is known only at run time (see
    _rows_kernel), for 2..8 float32 rows, where it was measured faster; 0 elsewhere (the
    prefetches written out; one row has none). The bits are the same either way."""
    return 4 if dtype == np.float32 and 2 <= t <= 8 else 0


def _in_pairs(dispatcher):
    """The numba function `dispatcher`, compiled with LLVM told to interleave every vectorized
    loop by 2: each dot product summed in two vector registers of partial sums (2 x 16 on an
    AMD EPYC with AVX-512), whatever the loop around it.

    A verify call's rows must come out as the one-token steps' do, bit for bit, so every loop
    that multiplies weights must split its sums alike. LLVM picks the split itself, from how
    many sums a loop keeps: the rows loop's 8 (4 outputs x 2 rows) it interleaves by 2, the
    one-row loop's single sum by 4 (other partial sums, other last bits). So the interleave is
    fixed for these loops, through LLVM's -force-vector-interleave while numba compiles them
    (under numba's compiler lock, and reset after, so no other numba code sees it); 2 is what
    LLVM picks for the rows loop here anyway, so its sums are the ones it always had. (The
    3-rows loop is a function of its own for the same reason: written inside the rows loop, its
    12 sums beside the other loop's 8 came out in other bits.)"""
    import llvmlite.binding as llvm
    from numba.core.compiler_lock import global_compiler_lock

    compile_ = dispatcher.compile

    def compile_in_pairs(sig):
        with global_compiler_lock:
            llvm.set_option("", "-force-vector-interleave=2")
            try:
                return compile_(sig)
            finally:
                llvm.set_option("", "-force-vector-interleave=0")  # 0: LLVM's own choice

    dispatcher.compile = compile_in_pairs  # numba compiles (or loads from its cache) through it
    return dispatcher


# ---- the weight products ---------------------------------------------------------------------

def _product_kernel(x, wt, y, ahead):  # pragma: no cover - runs compiled
    # y = x @ wt.T for x [T, D_in] float32 and wt [D_out, D_in] (float32, or the bits of a 16-bit
    # weight), one row through its own loop, more through the rows loop
    if x.shape[0] == 1:
        _one(x, wt, y)
    else:
        _rows(x, wt, y, ahead)


# The kernels are plain Python, compiled by numba (fastmath lets LLVM keep several partial sums
# per dot product in vector registers). Every loop that multiplies weights is compiled with its
# vectorized loops interleaved by 2 (`_in_pairs`), so LLVM splits each dot product's sum the
# same way in all of them (on an AMD EPYC with AVX-512: 2 registers of 16 lanes each) and a
# row's result is the same bits whether it comes from the one-row loop, the rows loop or the
# tails, alone or beside other rows (tests/test_backend.py checks it on the models' shapes).


def _rows_kernel(x, wt, y, ahead):  # pragma: no cover - runs compiled
    # x [T >= 2, D_in] times wt [D_out, D_in] -> y [T, D_out]: 4 outputs x 2 rows in registers
    # (an odd last row is paired with itself, except for 16-bit weights, see below). The 4
    # weight rows are read from memory once, then from the L1 cache for the other row pairs;
    # meanwhile the next 4 rows are prefetched into L2, a share per pass, so the memory keeps
    # streaming while the core multiplies: the hardware prefetcher does not follow 4 short
    # interleaved streams (without these prefetches a step's products took 2.3x as long,
    # measured with bfloat16 weights on the shipped target's shapes). `ahead` > 0: the 4
    # prefetches of a line go through a loop whose count (ahead = 4) is known only at run time,
    # which `ahead` asks for float32 weights and 2..8 rows: SmolLM2's float32 calls of 2, 3, 4
    # and 5 tokens then took 31, 28, 28 and 33 ms against 36, 37, 38 and 40 ms with the
    # prefetches written out side by side (the one-token step 28-29 ms either way; a script
    # alternating the two loops' calls, one thread, an AMD EPYC). Why is not known: the loop
    # likely spaces the prefetches out. For 16-bit weights, or 9+ rows, or one float32 row (its
    # own loop), the loop was as fast or slower (up to 1.1x; weights/README.md lists what was
    # tried).
    t, d = x.shape
    f = wt.shape[0]
    last = t - 1
    lines = (d + 15) // 16  # 16 weights apart: each float32 line, each half bfloat16 line
    spread = ahead > 0
    # two rows with `ahead` (float32) take a second pass, over the second row alone, whose sums
    # are thrown away: in one pass a block issued all its prefetches of the next at once, and
    # SmolLM2's float32 products of 2 rows took 28.5 ms against 22.5 ms with the idle pass (3
    # rows: 22.6 ms; weights/README.md, "One row, one stream")
    runs = 3 if t == 2 and spread else t
    # 16-bit weights, an odd count: the first pass multiplies 3 rows (_three_rows_kernel), the
    # others 2, so no row is multiplied twice. The shipped target's 5-token products took 2.68
    # ms against 2.87 ms paired, SmolLM2's in bfloat16 23.1 against 24.8 ms (3 and 9 tokens: 18.5
    # and 36.8 against 18.9 and 37.5 ms), alternating with the paired loop, medians. For float32
    # weights it lost at 3 rows (SmolLM2: 35.6 against 28.7 ms; one pass issues all the next
    # block's prefetches at once, as for 2 rows above), was level at 5 and gained 9% at 9.
    three = t % 2 == 1 and wt.itemsize == 2
    passes = (runs - 1) // 2 if three else (runs + 1) // 2
    for o in range(0, f - f % 4, 4):
        w0, w1, w2, w3 = wt[o], wt[o + 1], wt[o + 2], wt[o + 3]
        for r in range(1 if three else 0, runs, 2):
            share = r // 2
            for c in range(lines * share // passes, lines * (share + 1) // passes):
                if spread:  # a count known only at run time (see above)
                    for j in range(ahead):
                        _prefetch(wt, min(o + 4 + j, f - 1), c * 16)
                else:
                    for j in range(4):
                        _prefetch(wt, min(o + 4 + j, f - 1), c * 16)
            if three and r == 1:  # rows 0, 1 and 2
                _three(x, w0, w1, w2, w3, y, o)
                continue
            x0, x1 = x[min(r, last)], x[min(r + 1, last)]  # an odd last row pairs with itself
            a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0)
            for i in range(d):
                v0, v1, v2, v3 = _widen(w0[i]), _widen(w1[i]), _widen(w2[i]), _widen(w3[i])
                u = x0[i]
                a00 += v0 * u
                a01 += v1 * u
                a02 += v2 * u
                a03 += v3 * u
                u = x1[i]
                a10 += v0 * u
                a11 += v1 * u
                a12 += v2 * u
                a13 += v3 * u
            if r < t:
                y[r, o], y[r, o + 1], y[r, o + 2], y[r, o + 3] = a00, a01, a02, a03
            if r + 1 < t:
                y[r + 1, o], y[r + 1, o + 1], y[r + 1, o + 2], y[r + 1, o + 3] = a10, a11, a12, a13
    _tail(x, wt, y, f - f % 4)


def _three_rows_kernel(x, w0, w1, w2, w3, y, o):  # pragma: no cover - runs compiled
    # rows 0..2 of x [T >= 3, D_in] times the 4 weight rows w0..w3 -> y[:3, o:o + 4]: the rows
    # loop's first pass when it has an odd count of rows (4 outputs x 3 rows in registers,
    # 2 x 12 of the 32 vector registers)
    x0, x1, x2 = x[0], x[1], x[2]
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0)
    a20 = a21 = a22 = a23 = np.float32(0)
    for i in range(x.shape[1]):
        v0, v1, v2, v3 = _widen(w0[i]), _widen(w1[i]), _widen(w2[i]), _widen(w3[i])
        u = x0[i]
        a00 += v0 * u
        a01 += v1 * u
        a02 += v2 * u
        a03 += v3 * u
        u = x1[i]
        a10 += v0 * u
        a11 += v1 * u
        a12 += v2 * u
        a13 += v3 * u
        u = x2[i]
        a20 += v0 * u
        a21 += v1 * u
        a22 += v2 * u
        a23 += v3 * u
    y[0, o], y[0, o + 1], y[0, o + 2], y[0, o + 3] = a00, a01, a02, a03
    y[1, o], y[1, o + 1], y[1, o + 2], y[1, o + 3] = a10, a11, a12, a13
    y[2, o], y[2, o + 1], y[2, o + 2], y[2, o + 3] = a20, a21, a22, a23


def _one_row_kernel(x, wt, y):  # pragma: no cover - runs compiled
    # x [1, D_in] times wt [D_out, D_in] -> y [1, D_out]: one weight row at a time, so a step
    # reads the weights as one stream from the first byte to the last, which the CPU's own
    # prefetcher follows (no prefetch instructions). The loop before this one kept 8 outputs in
    # registers, reading 8 rows side by side and prefetching 8 rows two blocks ahead: on
    # SmolLM2-135M a step's one-row products took 26 ms in float32 and 14.7 ms in bfloat16,
    # against 18 and 12.3 ms here (the read test: 18.3 and 8.7 ms; weights/README.md, "One row,
    # one stream"). Its single sum is split in two like the rows loop's (see _in_pairs).
    d = x.shape[1]
    x0 = x[0]
    for o in range(wt.shape[0]):
        w0 = wt[o]
        a = np.float32(0)
        for i in range(d):
            a += _widen(w0[i]) * x0[i]
        y[0, o] = a


def _eight_rows_kernel(x, wt, y):  # pragma: no cover - runs compiled
    # x [T <= 8, D_in] times wt [D_out, D_in] -> y [T, D_out]: one output x 8 rows in registers
    # (missing rows repeat the last one): the outputs left over by the blocked kernels. 9 loads
    # per 8 multiply-adds (and padding to 8 rows): as the main loop for 2..8 rows it was slower
    # than _rows_kernel on a Xeon with AVX-512, on both shipped targets (`minispec bench` and
    # `minispec real bench` print the verify call's cost).
    t, d = x.shape
    last = t - 1
    x0, x1, x2, x3 = x[0], x[min(1, last)], x[min(2, last)], x[min(3, last)]
    x4, x5, x6, x7 = x[min(4, last)], x[min(5, last)], x[min(6, last)], x[min(7, last)]
    for o in range(wt.shape[0]):
        w0 = wt[o]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0)
        for i in range(d):
            v = _widen(w0[i])
            a0 += v * x0[i]
            a1 += v * x1[i]
            a2 += v * x2[i]
            a3 += v * x3[i]
            a4 += v * x4[i]
            a5 += v * x5[i]
            a6 += v * x6[i]
            a7 += v * x7[i]
        acc = (a0, a1, a2, a3, a4, a5, a6, a7)
        for r in range(t):
            y[r, o] = acc[r]


def _tail_kernel(x, wt, y, start):  # pragma: no cover - runs compiled
    # the outputs start.. that do not fill a block: the 8-rows loop, 8 rows at a time
    for r in range(0, x.shape[0], 8):
        _eight(x[r:r + 8], wt[start:], y[r:r + 8, start:])


def _widen_intrinsic(numba):
    """A numba function `_widen(v)`: a float32 weight as it is; a BF16 one (uint16) as the float32
    whose high 16 bits it is (zero-extend, shift left 16, reinterpret: LLVM vectorizes it); an
    F16 one (its bits as int16) converted half -> float (x86's vcvtph2ps)."""
    from llvmlite import ir
    from numba.extending import intrinsic

    @intrinsic
    def widen(typingctx, v):
        if v == numba.types.float32:
            return numba.types.float32(v), lambda context, builder, sig, args: args[0]
        if v == numba.types.int16:
            return numba.types.float32(v), lambda context, builder, sig, args: builder.fpext(
                builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        if v != numba.types.uint16:
            return None

        def codegen(context, builder, sig, args):
            bits = builder.shl(builder.zext(args[0], ir.IntType(32)),
                               ir.Constant(ir.IntType(32), 16))
            return builder.bitcast(bits, ir.FloatType())

        return numba.types.float32(v), codegen

    return widen


def _prefetch_intrinsic(numba):
    """A numba function `_prefetch(a, i, j)`: ask the CPU to start loading the cache line that
    holds a[i, j] into its L2 cache (LLVM's llvm.prefetch, locality 2: x86's prefetcht1), without
    waiting for it. Into L2, not L1: the rows kernel asks for a whole block of weight rows ahead,
    likely more lines than the L1 cache can have in flight; prefetched into L1 (prefetcht0), a
    5-row product over SmolLM2's LM head took 1.7x the one-row product instead of 1.1-1.2x (an
    AMD EPYC with AVX-512; one-row products were as fast either way)."""
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, a, i, j):
        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], arr, args[1:])
            if not getattr(ptr.type, "is_opaque", False):  # LLVM < 15: typed pointers
                ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                "llvm.prefetch." + ("p0" if getattr(ptr.type, "is_opaque", False) else "p0i8"))
            builder.call(fn, [ptr, i32(0), i32(2), i32(1)])  # read, into L2 (not L1), data
            return context.get_dummy_value()

        return numba.types.void(a, i, j), codegen

    return prefetch


# ---- the pieces of a block -------------------------------------------------------------------

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


def _block_front(x, attn_norm_w, wqkv, wo, mlp_norm_w, w_gate, w_up, eps, cos, sin, k_cache,
                 v_cache, positions, slots, tree, has_tree, n_heads, n_kv, scale, window,
                 ahead):  # pragma: no cover - runs compiled
    # model.block for a Llama-shaped layer (RMSNorm, RoPE, SwiGLU, no biases) on x [T, D], as far
    # as the MLP's SiLU: the loops above one after the other, in one call -> h = x + attn [T, D]
    # and the MLP's two products of norm(h), gate and up [T, F]. The weights are the transposes
    # [D_out, D_in] the product reads.
    t, d = x.shape
    e = 2 * cos.shape[1]
    xn = np.empty_like(x)
    _norm(x, attn_norm_w, eps, xn)
    qkv = np.empty((t, wqkv.shape[0]), np.float32)
    _product(xn, wqkv, qkv, ahead)
    qkv = qkv.reshape((t, n_heads + 2 * n_kv, e))
    _rope(qkv, cos, sin, k_cache, v_cache, positions, slots, n_heads, n_kv)
    att = np.empty((t, n_heads * e), np.float32)
    _attend(qkv, k_cache, v_cache, positions, slots, tree, has_tree, n_heads, scale, window, att)
    h = np.empty((t, d), np.float32)
    _product(att, wo, h, ahead)
    for r in range(t):
        for i in range(d):
            h[r, i] += x[r, i]  # x + attn
    _norm(h, mlp_norm_w, eps, xn)
    gate = np.empty((t, w_gate.shape[0]), np.float32)
    up = np.empty((t, w_up.shape[0]), np.float32)
    _product(xn, w_gate, gate, ahead)
    _product(xn, w_up, up, ahead)
    return h, gate, up
