"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, one code path through `xp`.

The model code never imports numpy or cupy itself; it is handed `xp`. A CPU-only machine never
needs CuPy installed: it is imported only when the GPU is asked for (or `auto` looks for it).

Two CPU speed details live here, out of the model's math: `matmul`, which model.py calls for
every weight product (`x @ w`; a few float32 rows go through a numba kernel that reads each weight
once for all of them, when numba is installed), and NumPy's BLAS thread pool: decode-sized
matmuls are often faster on one thread than on several, and many times slower when the threads
compete with another process. The command line and the benchmarks set the threads; the model
math never does.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np

from .errors import MinispecError

DEVICES = ("auto", "cpu", "gpu")


def _cupy_or_none() -> ModuleType | None:
    try:
        import cupy
    except Exception:  # noqa: BLE001 - not installed, or installed without a working CUDA runtime
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # noqa: BLE001 - no driver, no device: CuPy raises its own runtime errors
        return None
    return cupy


def get_backend(device: str = "auto") -> tuple[ModuleType, str]:
    """Return (xp, device) for device "auto" | "cpu" | "gpu"; the device returned is "cpu" or "gpu".

    "auto" takes the GPU when CuPy imports and sees a device, else the CPU.
    """
    if device not in DEVICES:
        raise MinispecError(f"device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return np, "cpu"
    cupy = _cupy_or_none()
    if cupy is not None:
        return cupy, "gpu"
    if device == "gpu":
        raise MinispecError(
            "device='gpu': CuPy is not installed or sees no NVIDIA GPU "
            "(pip install 'minispec[gpu]' with CUDA 13, 'minispec[gpu-cuda12]' with CUDA 12)"
        )
    return np, "cpu"


def memory_bytes(xp) -> int:
    """The memory of the device `xp` computes on: the GPU's (CuPy), else the machine's RAM."""
    if xp is not np:
        return int(xp.cuda.Device().mem_info[1])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no bound known
        return 2**63


def to_host(a) -> np.ndarray:
    """A NumPy array with the contents of `a` (a NumPy or CuPy array, or anything array-like)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)  # cupy.ndarray.get() copies device -> host
    return get() if callable(get) else np.asarray(a)


# ---- where the weights live ----------------------------------------------------------------


class Arena:
    """Weight matrices copied side by side into large blocks of memory, each matrix starting on
    a cache line, in the order the caller puts them (a step's order: one stream).

    Each matrix of a small model is a few MB, an allocation of its own: 4 KB pages (NumPy asks
    the kernel for 2 MB pages only for arrays of 4 MB or more, and not for those malloc serves
    from its heap) and rows that straddle cache lines (malloc aligns to 16 bytes). A decode step
    that streams every weight then walks a new page table entry every 4 KB. The arena's blocks
    are anonymous memory maps of 64 MB marked for 2 MB pages (`madvise(MADV_HUGEPAGE)`, which
    the kernel honours where transparent huge pages are `madvise` or `always`). Values are
    unchanged: only where they live.
    """

    BLOCK = 64 << 20
    ALIGN = 64
    PAGE = 2 << 20

    def __init__(self) -> None:
        self._block: np.ndarray | None = None
        self._used = 0

    def put(self, a: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of `a` in the arena (a block of its own if larger than one)."""
        start = 0 if self._block is None else -(-self._used // self.ALIGN) * self.ALIGN
        if self._block is None or start + a.nbytes > len(self._block):
            self._block, start = self._new_block(max(self.BLOCK, a.nbytes)), 0
        self._used = start + a.nbytes
        out = self._block[start:self._used].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    def _new_block(self, nbytes: int) -> np.ndarray:
        # a map of one page more than asked, used from its first 2 MB boundary (the map is
        # 4 KB-aligned); marked before anything is written, so the pages come 2 MB at a time
        private = getattr(mmap, "MAP_PRIVATE", None)  # Unix: not shared memory (no 2 MB pages)
        m = (mmap.mmap(-1, nbytes + self.PAGE) if private is None
             else mmap.mmap(-1, nbytes + self.PAGE, flags=private))
        if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
            with contextlib.suppress(OSError):  # a kernel built without huge pages: 4 KB ones
                m.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(m, np.uint8)  # keeps the map alive as long as any view of it
        skip = -raw.ctypes.data % self.PAGE
        return raw[skip:skip + nbytes]


# ---- the weight products -------------------------------------------------------------------
#
# A decode step is bound by reading the weights: checking k drafted tokens should cost about what
# one token does, because each weight, once read, can be multiplied with all k rows. NumPy's
# OpenBLAS does not do that for a few rows: it first copies ("packs") the whole weight matrix, so
# 2 rows cost 2-4x one row. `few_rows_matmul` below reads each weight once for all rows. Weights
# are stored one output per row (loader.py keeps the checkpoint's [D_out, D_in] and hands model.py
# the transposed view w [D_in, D_out]), so each output's weights are one contiguous stream.
#
# Weights as stored. A bfloat16 checkpoint's weights can stay 16-bit in memory: NumPy has no
# bfloat16, so they are kept as uint16 arrays holding the top half of each float32 (`BF16`), and
# the kernels widen each weight in a register (bfloat16 -> float32 is exact: the 16 bits become
# the high half of the float32), then multiply and accumulate in float32 as for float32 weights,
# in the same order: the same bits out, for half the bytes read. A float16 checkpoint's weights
# stay float16 (`F16`, NumPy's own), widened in a register too (a half -> float conversion, also
# exact; numba has no float16 arrays, so the kernels see them as int16). `widen` is the NumPy
# reference.

BF16 = np.dtype(np.uint16)  # how a bfloat16 weight is held on the CPU
F16 = np.dtype(np.float16)  # and a float16 one


def widen(w: np.ndarray) -> np.ndarray:
    """A 16-bit weight held as stored (BF16 or F16) -> float32, exactly; a float32 one
    unchanged."""
    if w.dtype == F16:
        return w.astype(np.float32)
    if w.dtype != BF16:
        return w
    return (w.astype(np.uint32) << 16).view(np.float32)  # same shape; a view of a new array

KERNEL_MAX_ROWS = 32  # more rows than this go to the BLAS, whose packing then pays for itself

_KERNEL_WEIGHTS = (np.dtype(np.float32), BF16, F16)
_kernel_wanted = True  # use_kernel(False) sends every product to `x @ w`, for tests and bench
_kernels: tuple | None = None  # (the rows kernel,), compiled on first use; () if no numba
_prefetch = _eight = _tail = _widen = None  # numba functions the kernels call, made with them


def matmul(x, w):
    """x @ w for activations x [T, D_in] and a weight w [D_in, D_out] (or a transposed view).

    The same product everywhere. On the CPU, 1..32 float32 rows against a float32, BF16 or F16
    weight stored one output per row (w.T C-contiguous: every weight loader.py makes) go through
    `few_rows_matmul`; everything else is `x @ w` (CuPy's is cuBLAS), a 16-bit weight widened
    first.
    """
    if (isinstance(x, np.ndarray) and x.ndim == 2 and 1 <= x.shape[0] <= KERNEL_MAX_ROWS
            and x.dtype == np.float32 and w.dtype in _KERNEL_WEIGHTS and w.ndim == 2
            and w.T.flags.c_contiguous and _kernel_wanted and _compiled()):
        return _run_kernel(x, w)  # the checks few_rows_matmul makes were just made
    if isinstance(w, np.ndarray) and (w.dtype == BF16 or w.dtype == F16 != x.dtype):
        w = widen(w)  # as stored -> float32 (a float16 model's own float16 weights stay)
    return x @ w


def few_rows_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w for a few float32 rows x [T, D_in], reading each weight of w [D_in, D_out] once.

    w: float32, BF16 or F16 (widened in registers), a transposed view of a C-contiguous
    [D_out, D_in] array. Needs numba (a
    MinispecError without it). Each output is a dot product of one contiguous weight row with
    each x row, summed in the same order whatever T is, so a row's result does not depend on the
    rows beside it: a verify call's logits equal those of one-token steps, bit for bit, as far
    as the weight products go. tests/test_backend.py checks it against `x @ w`.
    """
    if not _compiled():
        raise MinispecError("few_rows_matmul: needs numba (pip install numba)")
    if not (x.dtype == np.float32 and w.dtype in _KERNEL_WEIGHTS and w.T.flags.c_contiguous
            and x.ndim == 2 and x.shape[1] == w.shape[0]):
        raise MinispecError(f"few_rows_matmul: expected float32 x [T, D_in] and float32, BF16 or "
                            f"F16 w [D_in, D_out] stored [D_out, D_in], got x {x.dtype} "
                            f"{x.shape}, w {w.dtype} {w.shape} (C-contiguous transpose: "
                            f"{w.T.flags.c_contiguous})")
    return _run_kernel(x, w)


def _run_kernel(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)  # [T, D_out]
    wt = w.T if w.dtype != F16 else w.T.view(np.int16)  # numba reads float16 as int16 bits
    x = np.ascontiguousarray(x)
    if x.shape[0] == 1:  # one row: its own loop; bfloat16 weights: prefetches counted at run time
        _kernels[1](x, wt, y, 8 if w.dtype == BF16 else 0)
    else:  # float32 weights, 2..8 rows: the prefetch loop with a count given at run time
        _kernels[0](x, wt, y, 4 if w.dtype == np.float32 and x.shape[0] <= 8 else 0)
    return y


@contextlib.contextmanager
def use_kernel(on: bool) -> Iterator[bool]:
    """Run a block with the few-rows kernel on or off (off: every product is NumPy's `x @ w`);
    yields whether the kernel is in use (False without numba)."""
    global _kernel_wanted
    before, _kernel_wanted = _kernel_wanted, bool(on)
    try:
        yield _kernel_wanted and _compiled()
    finally:
        _kernel_wanted = before


def kernel_available() -> bool:
    """Whether the few-rows kernel can run here (numba imports)."""
    return _compiled()


def _compiled() -> bool:
    # numba is imported on the first product, not with minispec; the machine code comes from
    # numba's cache (cache=True) after the first run on a machine
    global _kernels, _prefetch, _eight, _tail, _widen
    if _kernels is None:
        try:
            import numba
        except ImportError:
            _kernels = ()
        else:
            jit = numba.njit(fastmath=True, cache=True)
            _widen = _widen_intrinsic(numba)
            _prefetch, _eight = _prefetch_intrinsic(numba), jit(_eight_rows_kernel)
            _tail = jit(_tail_kernel)
            _kernels = (jit(_rows_kernel), jit(_one_row_kernel))
    return bool(_kernels)


# The kernels are plain Python, compiled by numba (fastmath lets LLVM keep several partial sums
# per dot product in vector registers). Kept apart from matmul so a reader can skip them. Both
# have 8 accumulators in their inner loop, so LLVM vectorizes each dot product the same way (on
# an AMD EPYC with AVX-512: 2 registers of 16 lanes each) and a row's result is the same bits
# whether it comes from the main loop or the tails, alone or beside other rows
# (tests/test_backend.py checks it on the models' shapes). A loop with other accumulators can be
# unrolled differently and round differently: a one-row loop over a single weight row (one
# accumulator) read float32 weights 1.8x faster, but its sums round differently, and a verify
# call's logits would then differ from the one-token steps' in the last bits. The one-row loop
# below keeps 8 accumulators (8 outputs), and so the same sums.


def _rows_kernel(x, wt, y, ahead):  # pragma: no cover - runs compiled
    # x [T >= 2, D_in] times wt [D_out, D_in] -> y [T, D_out]: 4 outputs x 2 rows in registers
    # (an odd last row is paired with itself). The 4 weight rows are read from memory once, then
    # from the L1 cache for the other row pairs; meanwhile the next 4 rows are prefetched into
    # L2, a share per pass, so the memory keeps streaming while the core multiplies: the
    # hardware prefetcher does not follow 4 short interleaved streams (without these prefetches
    # a step's products took 2.3x as long, measured with bfloat16 weights on the shipped
    # target's shapes). `ahead` > 0: the 4 prefetches of a line go through a loop whose count
    # (ahead = 4) is known only at run time, which _run_kernel asks for float32 weights and 2..8
    # rows: SmolLM2's float32 calls of 2, 3, 4 and 5 tokens then took 31, 28, 28 and 33 ms
    # against 36, 37, 38 and 40 ms with the prefetches written out side by side (the one-token
    # step 28-29 ms either way; a script alternating the two loops' calls, one thread, an AMD
    # EPYC). Why is not known: the loop likely spaces the prefetches out. For 16-bit weights,
    # or 9+ rows, or one float32 row (its own loop), the loop was as fast or slower (up to 1.1x;
    # weights/README.md lists what was tried).
    t, d = x.shape
    f = wt.shape[0]
    last = t - 1
    lines = (d + 15) // 16  # 16 weights apart: each float32 line, each half bfloat16 line
    passes = (t + 1) // 2
    spread = ahead > 0
    for o in range(0, f - f % 4, 4):
        w0, w1, w2, w3 = wt[o], wt[o + 1], wt[o + 2], wt[o + 3]
        for r in range(0, t, 2):
            x0, x1 = x[r], x[min(r + 1, last)]  # an odd last row is paired with itself
            share = r // 2
            for c in range(lines * share // passes, lines * (share + 1) // passes):
                if spread:  # a count known only at run time (see above)
                    for j in range(ahead):
                        _prefetch(wt, min(o + 4 + j, f - 1), c * 16)
                else:
                    for j in range(4):
                        _prefetch(wt, min(o + 4 + j, f - 1), c * 16)
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
            y[r, o], y[r, o + 1], y[r, o + 2], y[r, o + 3] = a00, a01, a02, a03
            if r + 1 < t:
                y[r + 1, o], y[r + 1, o + 1], y[r + 1, o + 2], y[r + 1, o + 3] = a10, a11, a12, a13
    _tail(x, wt, y, f - f % 4)


def _one_row_kernel(x, wt, y, ahead):  # pragma: no cover - runs compiled
    # x [1, D_in] times wt [D_out, D_in] -> y [1, D_out]: 8 outputs in registers, each weight
    # row read once, while the 8 rows two blocks ahead are prefetched into L2. A decode step's
    # products, 1.1-1.25x faster than the rows loop with the row paired with itself (which
    # does every multiply-add twice), measured on the shipped target's bfloat16 shapes; an
    # earlier one-row loop that prefetched only the first 2 lines of the next block's rows was
    # 1.6x slower than that rows loop. `ahead` > 0: the 8 prefetches of a line go through a
    # loop whose count is known only at run time, as the rows loop's do (see there), which
    # _run_kernel asks for bfloat16 weights: with the weights in the Arena, the products of a
    # step 1.1x (SmolLM2-135M in bfloat16) to 1.25x (the shipped target) faster; for float32
    # weights 1.1x slower, and 1.25x slower for the shipped float16 draft model, whose 2.4 MB
    # stay in the caches between steps (weights/README.md).
    d = x.shape[1]
    f = wt.shape[0]
    x0 = x[0]
    lines = (d + 15) // 16
    spread = ahead > 0
    for o in range(0, f - f % 8, 8):
        w0, w1, w2, w3 = wt[o], wt[o + 1], wt[o + 2], wt[o + 3]
        w4, w5, w6, w7 = wt[o + 4], wt[o + 5], wt[o + 6], wt[o + 7]
        for c in range(lines):
            if spread:  # a count known only at run time (see above)
                for j in range(ahead):
                    _prefetch(wt, min(o + 16 + j, f - 1), c * 16)
            else:
                for j in range(8):
                    _prefetch(wt, min(o + 16 + j, f - 1), c * 16)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0)
        for i in range(d):
            u = x0[i]
            a0 += _widen(w0[i]) * u
            a1 += _widen(w1[i]) * u
            a2 += _widen(w2[i]) * u
            a3 += _widen(w3[i]) * u
            a4 += _widen(w4[i]) * u
            a5 += _widen(w5[i]) * u
            a6 += _widen(w6[i]) * u
            a7 += _widen(w7[i]) * u
        y[0, o], y[0, o + 1], y[0, o + 2], y[0, o + 3] = a0, a1, a2, a3
        y[0, o + 4], y[0, o + 5], y[0, o + 6], y[0, o + 7] = a4, a5, a6, a7
    _tail(x, wt, y, f - f % 8)


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


# ---- NumPy's BLAS threads ----------------------------------------------------------------


def _openblas() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) for the OpenBLAS that NumPy loaded, found through ctypes (Linux), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in [("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")]:
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                set_.argtypes = [ctypes.c_int]
                return get, set_
    return None


def get_blas_threads() -> int | None:
    """Threads NumPy's BLAS uses now, or None when this cannot be found out."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        lib = _openblas()
        return None if lib is None else int(lib[0]())
    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(counts) if counts else None


def set_blas_threads(n: int) -> int | None:
    """Set NumPy's BLAS thread count (threadpoolctl if installed, else OpenBLAS through ctypes).

    Returns the previous count, or None when the BLAS cannot be controlled (then nothing changes).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise MinispecError(f"threads: expected an integer >= 1, got {n!r}")
    before = get_blas_threads()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        lib = _openblas()
        if lib is None:
            return None
        lib[1](n)
        return before
    threadpool_limits(n, user_api="blas")
    return before


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[int | None]:
    """Run a block with NumPy's BLAS on n threads; yields the count in effect (None: unknown)."""
    before = set_blas_threads(n)
    try:
        yield get_blas_threads()
    finally:
        if before is not None:
            set_blas_threads(before)
