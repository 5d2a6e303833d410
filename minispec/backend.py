"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, one code path through `xp`.

The model code never imports numpy or cupy itself; it is handed `xp`. A CPU-only machine never
needs CuPy installed: it is imported only when the GPU is asked for (or `auto` looks for it).

Two CPU speed details live here, out of the model's math: `matmul`, which model.py calls for
every weight product (`x @ w`, with a blocking that suits OpenBLAS when a few rows come in), and
NumPy's BLAS thread pool: decode-sized matmuls (a few rows times a weight matrix) are often faster
on one thread than on several, and many times slower when the threads compete with another
process. The command line and the benchmarks set the threads; the model math never does.
"""

from __future__ import annotations

import contextlib
import ctypes
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
            "(pip install 'minispec[gpu]' on a machine with CUDA 12)"
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


# ---- the weight products -------------------------------------------------------------------


def matmul(x, w):
    """x @ w for activations x [T, D_in] and a weight w [D_in, D_out] (or a transposed view).

    The same product everywhere; on the CPU, 2 to 16 float32 rows (a verify call's gamma + 1
    tokens, a drafter's catch-up) go through `few_rows_matmul`, which OpenBLAS runs faster.
    """
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and 1 < x.shape[0] <= 16:
        return few_rows_matmul(x, w)
    if isinstance(x, np.ndarray) and x.shape[0] > 16 and _transposed(w):
        # a tied LM head under a batch's rows: OpenBLAS takes the product about 2x faster as
        # embedding [V, D] @ x.T than as x @ its transposed view
        return (w.T @ x.T).T
    return x @ w


def _transposed(w) -> bool:
    return w.flags.f_contiguous and not w.flags.c_contiguous


SMALL_GEMM = 10**6  # OpenBLAS multiplies without repacking when rows * columns * depth <= this
SMALL_GEMM_T = 1200  # ... and, for a transposed w, when rows * columns <= this


def few_rows_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w for a few float32 rows on the CPU, in blocks OpenBLAS multiplies without repacking.

    Given a handful of rows, OpenBLAS's sgemm first copies ("packs") the whole of w, so 5 rows
    cost about 3x one row (a matrix-vector product, which reads w in place); the tied LM head,
    a transposed view, about 5x. Its small-matrix kernels skip that copy when rows * columns *
    depth <= SMALL_GEMM (and, for a transposed w, rows * columns <= SMALL_GEMM_T), so w goes in
    blocks that qualify: slices of its input rows, summed; for a transposed w, slices of its
    output columns, side by side. The same product up to float32 rounding, at about 1.5-2x one
    row for 5 rows (`minispec bench` prints the verify-cost curve). Tuned for NumPy's OpenBLAS;
    harmless elsewhere. tests/test_backend.py checks it against `x @ w` at the shipped shapes.
    """
    t, d = x.shape  # [T, D_in]
    f = w.shape[1]  # D_out
    if _transposed(w):  # blocks of n columns
        n = 128
        while n > 8 and (n * t > SMALL_GEMM_T or n * t * d > SMALL_GEMM):
            n //= 2
        return np.concatenate([x @ w[:, j:j + n] for j in range(0, f, n)], axis=1)  # [T, D_out]
    k = 64
    while k > 8 and k * t * f > SMALL_GEMM:
        k //= 2
    y = x[:, :k] @ w[:k]  # [T, k] @ [k, D_out] -> [T, D_out], summed over slices of D_in
    for i in range(k, d, k):
        y += x[:, i:i + k] @ w[i:i + k]
    return y


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
