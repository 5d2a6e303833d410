"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, one code path through `xp`.

The model code never imports numpy or cupy itself; it is handed `xp`. A CPU-only machine never needs CuPy
installed: it is imported only when the GPU is asked for (or `auto` looks for it).
"""

from __future__ import annotations

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


def to_host(a) -> np.ndarray:
    """A NumPy array with the contents of `a` (a NumPy or CuPy array, or anything array-like)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)  # cupy.ndarray.get() copies device -> host
    return get() if callable(get) else np.asarray(a)
