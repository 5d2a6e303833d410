"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, one code path through `xp`.

The model code never imports numpy or cupy itself; it is handed `xp`. A CPU-only machine never
needs CuPy installed: it is imported only when the GPU is asked for (or `auto` looks for it).

Two CPU speed details live here, out of the model's math: `matmul`, which model.py calls for
every weight product (`x @ w`; a few float32 rows go through a numba kernel that reads each
weight once for all of them, when numba is installed: its loops are in kernels.py), and NumPy's
BLAS thread pool: decode-sized matmuls are often faster on one thread than on several, and many
times slower when the threads compete with another process. The command line and the
benchmarks set the threads; the model math never does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import time
import weakref
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
        try:
            m = (mmap.mmap(-1, nbytes + self.PAGE) if private is None
                 else mmap.mmap(-1, nbytes + self.PAGE, flags=private))
        except OSError as e:  # out of memory: what NumPy raises, not an OSError
            if e.errno != errno.ENOMEM:
                raise
            raise MemoryError(f"the weights' arena: no memory for a block of {nbytes} bytes") \
                from None
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
# 2 rows cost 2-4x one row. `few_rows_matmul` below reads each weight once for all rows, from a
# copy of it laid out for the kernel (kernels.tiles: 64 outputs side by side for each input),
# made on the weight's first product and kept while the weight lives (`kernel_weight`): the
# kernel's speed costs a second copy of each weight it multiplies. loader.py keeps the
# checkpoint's [D_out, D_in] and hands model.py the transposed view w [D_in, D_out].
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

KERNEL_MAX_ROWS = 256  # more rows than this go to the BLAS (the kernel was faster up to 256 rows)

_KERNEL_WEIGHTS = (np.dtype(np.float32), BF16, F16)
_kernel_wanted = True  # use_kernel(False) sends every product to `x @ w`, for tests and bench
_loops = None  # minispec/kernels.py's compiled loops, made on the first product; False: no numba


def matmul(x, w):
    """x @ w for activations x [T, D_in] and a weight w [D_in, D_out] (or a transposed view).

    The same product everywhere. On the CPU, 1..KERNEL_MAX_ROWS (256) float32 rows against a
    float32, BF16 or F16 weight stored one output per row (w.T C-contiguous: every weight
    loader.py makes) go through `few_rows_matmul`; everything else is `x @ w` (CuPy's is
    cuBLAS), a 16-bit weight widened first. A weight kept for int8 activations (`keep_blocks`
    with int8=True) takes the kernel's int8 product at any number of rows, even with the kernel
    turned off (`use_kernel`): that model has no other arithmetic.
    """
    if (isinstance(x, np.ndarray) and x.ndim == 2 and 1 <= x.shape[0] <= KERNEL_MAX_ROWS
            and x.dtype == np.float32 and w.dtype in _KERNEL_WEIGHTS and w.ndim == 2
            and w.T.flags.c_contiguous and _kernel_wanted and _compiled()):
        return _run_kernel(x, w)  # the checks few_rows_matmul makes were just made
    if (isinstance(w, np.ndarray) and kept_for_int8(w) and isinstance(x, np.ndarray)
            and x.ndim == 2 and x.dtype == np.float32 and x.shape[0] >= 1):
        return _run_kernel(x, w)  # a model of int8 activations: every row count, one arithmetic
    if isinstance(w, np.ndarray) and (w.dtype == BF16 or w.dtype == F16 != x.dtype):
        w = widen(w)  # as stored -> float32 (a float16 model's own float16 weights stay)
    return x @ w


def few_rows_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w for a few float32 rows x [T, D_in], reading each weight of w [D_in, D_out] once.

    w: float32, BF16 or F16 (widened in registers), a transposed view of a C-contiguous
    [D_out, D_in] array. Needs numba (a MinispecError without it). Each output is summed in one
    order whatever T is (one fused multiply-add per input, first to last), so a row's result
    does not depend on the rows beside it: a verify call's logits equal those of one-token
    steps, bit for bit, as far as the weight products go. tests/test_backend.py checks it
    against `x @ w`.
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
    tiles = kernel_weight(w)
    product_for(tiles)(np.ascontiguousarray(x), tiles, y)
    return y


def product_for(tiles: np.ndarray):
    """The compiled product that reads these tiles (kernel_weight's): the block product for GGUF
    blocks' (uint8), the int8 product for int8 activations' (int8), else the float product."""
    _compiled()
    return (_loops.block_product if tiles.dtype == np.uint8 else
            _loops.int8_product if tiles.dtype == np.int8 else _loops.product)


_TILES: dict[int, tuple[weakref.ref, np.ndarray]] = {}  # id(w) -> (w, the tiles of w)
_TILE_ARENA = Arena()  # where the tiles live: side by side, in the order of first use


def kernel_weight(w: np.ndarray) -> np.ndarray:
    """The array the kernel reads for a weight w [D_in, D_out] stored [D_out, D_in]: its tiles
    (kernels.tiles; a float16 weight's as int16 bits, numba has no float16 arrays), made on the
    first call for w and kept until w is freed, in an Arena: on 2 MB pages, one after the other
    in the order a step first multiplies them. From then on w (and the array it views) is
    read-only: a change in place would not reach the copy, so NumPy refuses it (to change a
    weight, put a new array in the model's weights). A weight given its GGUF blocks
    (`keep_blocks`) has the blocks' tiles, made then (uint8: the block product reads them).
    """
    key = id(w)
    hit = _TILES.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    from .kernels import tiles

    return _keep_tiles(w, tiles(w.T if w.dtype != F16 else w.T.view(np.int16)))


def _keep_tiles(w: np.ndarray, made: np.ndarray) -> np.ndarray:
    """`made` into the arena as the tiles the kernel reads for w, kept while w lives; w (and
    the array it views) read-only from now on (kernel_weight says why)."""
    key = id(w)
    made = _TILE_ARENA.put(made)
    _TILES[key] = (weakref.ref(w, lambda _: _TILES.pop(key, None)), made)
    for a in (w, w.base):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return made


# Weights kept as GGUF blocks. A model converted from a GGUF file (minispec.convert) holds its
# weights in float32, the values gguf's dequantize gives; the blocks they came from (Q4_1: 5 bits
# a weight, Q8_0: 8.5) hold the same values exactly, and the kernel's block product rebuilds
# each one in a register (kernels.py, "weights kept as their GGUF blocks"): the same bits out,
# for a fifth of the bytes read. loader.py hands each such weight its blocks here; the float32
# weight stays the reference, NumPy's `x @ w`, and what a call of many rows (a prefill) reads.


def keep_blocks(w: np.ndarray, blocks: np.ndarray, int8: bool = False) -> None:
    """From now on the kernel reads the float32 weight w [D_in, D_out] (stored [D_out, D_in])
    from its GGUF blocks, uint8 [D_out, D_in / 32, 20] (Q4_1) or [..., 34] (Q8_0), which must
    hold exactly w's values (kernels.dequantize(blocks) == w.T: the caller checks): their
    tiles (kernels.block_tiles) are made now, in the kernel's arena, in place of w's own.
    int8=True: their int8_tiles instead, and every product with w multiplies x quantized to
    int8 (kernels.py, "int8 activations"; needs AVX-512 VNNI: int8_supported)."""
    from .kernels import Q4_1_BLOCK, Q8_0_BLOCK, block_tiles, int8_tiles

    d_in, d_out = w.shape
    if not (w.dtype == np.float32 and blocks.dtype == np.uint8 and blocks.ndim == 3
            and d_in % 32 == 0 and blocks.shape[:2] == (d_out, d_in // 32)
            and blocks.shape[2] in (Q4_1_BLOCK, Q8_0_BLOCK) and w.T.flags.c_contiguous):
        raise MinispecError(f"keep_blocks: expected blocks uint8 [{d_out}, {d_in // 32}, 20 or "
                            f"34] for a float32 weight [{d_in}, {d_out}], got {blocks.dtype} "
                            f"{list(blocks.shape)} for {w.dtype} {list(w.shape)}")
    if int8:
        if not int8_supported():
            raise MinispecError("keep_blocks: int8 activations need numba and a CPU with "
                                "AVX-512 VNNI (avx512vnni)")
        _keep_tiles(w, int8_tiles(blocks))
    else:
        _keep_tiles(w, block_tiles(blocks))


def int8_supported() -> bool:
    """Whether this machine runs the int8 product: numba, and AVX-512 VNNI (vpdpbusd)."""
    if not _compiled():
        return False
    from .kernels import _cpu_features

    return "+avx512vnni" in _cpu_features()


def _kept_tiles_dtype(w):
    """The dtype of the tiles kept for w (kernel_weight), or None where none are."""
    hit = _TILES.get(id(w))
    return hit[1].dtype if hit is not None and hit[0]() is w else None


def kept_as_blocks(w) -> bool:
    """Whether the kernel reads w from its GGUF blocks (keep_blocks)."""
    return _kept_tiles_dtype(w) in (np.uint8, np.int8)


def kept_for_int8(w) -> bool:
    """Whether every product with w multiplies int8 activations (keep_blocks, int8=True)."""
    return _kept_tiles_dtype(w) == np.int8


def stored_bytes(w) -> int:
    """Bytes a product of one row reads for the weight w: its GGUF blocks' tiles where it has
    them, else the array as held (float32, or 16-bit as stored)."""
    return int(_TILES[id(w)][1].nbytes) if kept_as_blocks(w) else int(w.size) * w.dtype.itemsize


ONE_ROW_AHEADS = (768, 1536, 3072)  # the distances tune_one_row tries, in bytes of a tile
ONE_ROW_GAIN = 0.03  # the one-row hint is kept where it makes one-row products this much faster
_one_row_timed = 0  # the bytes of the largest set of weights tune_one_row has timed


def tune_one_row(weights, rounds: int = 3) -> int | None:
    """Choose, for this process, whether and how far a product of one row asks the memory for
    its tile ahead (kernels.set_one_row_ahead: a hint, no value changes): the products of one
    row with `weights` (a model's matrices; those the kernel reads as float32 or 16-bit tiles)
    timed without the hint and with it at each distance of ONE_ROW_AHEADS, in turn, a first
    round to warm up and `rounds` timed, the best of each kept; the fastest distance if it is
    ONE_ROW_GAIN faster than none (on the Xeon guest the best distance moved within the hour:
    weights/README.md, "Prefetching in one-row passes, chosen at run time"). The
    largest set of weights timed so far decides (cpu_steps.enable tunes on every model it
    serves: a target decides over its draft model, whichever comes first). On a machine
    where a model's weights stay in the caches both take the same time, and no hint is asked.
    -> the bytes chosen, or None where nothing was timed (no numba, no such weights, or no
    more bytes of them than those that decided)."""
    global _one_row_timed
    if not _compiled():
        return None
    from . import kernels

    tiles = [kernel_weight(w) for w in weights  # float32 or 16-bit tiles: not GGUF blocks'
             if isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype in _KERNEL_WEIGHTS
             and w.T.flags.c_contiguous and not kept_as_blocks(w)]
    size = sum(t.nbytes for t in tiles)
    if size <= _one_row_timed:
        return None
    xs = {d: np.ones((1, d), np.float32) for d in {t.shape[1] for t in tiles}}
    ys = [np.empty((1, t.shape[0] * t.shape[2]), np.float32) for t in tiles]

    def one_pass(nbytes: int) -> float:
        kernels.set_one_row_ahead(nbytes)
        start = time.perf_counter()
        for t, y in zip(tiles, ys):
            _loops.product(xs[t.shape[1]], t, y)
        return time.perf_counter() - start

    best = dict.fromkeys((0, *ONE_ROW_AHEADS), float("inf"))
    for i in range(rounds + 1):  # round 0 warms up: its times are not kept
        for nbytes in best:
            took = one_pass(nbytes)
            if i > 0:
                best[nbytes] = min(best[nbytes], took)
    fastest = min(ONE_ROW_AHEADS, key=best.get)
    chosen = fastest if best[fastest] < (1 - ONE_ROW_GAIN) * best[0] else 0
    kernels.set_one_row_ahead(chosen)
    _one_row_timed = size
    return chosen


@contextlib.contextmanager
def use_kernel(on: bool) -> Iterator[bool]:
    """Run a block with the few-rows kernel on or off (off: every product is NumPy's `x @ w`);
    yields whether the kernel is in use (False without numba)."""
    global _kernel_wanted
    before, _kernel_wanted = _kernel_wanted, bool(on)
    try:
        yield kernel_in_use()
    finally:
        _kernel_wanted = before


def kernel_in_use() -> bool:
    """Whether a product of a few rows goes through the kernel now (numba imports, and
    use_kernel has not turned it off)."""
    return _kernel_wanted and _compiled()


def kernel_available() -> bool:
    """Whether the few-rows kernel can run here (numba imports)."""
    return _compiled()


def _compiled() -> bool:
    global _loops
    if _loops is None:  # the speed path's loops: imported (and numba with them) on first use
        from . import kernels

        _loops = kernels.compiled() or False
    return bool(_loops)


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
