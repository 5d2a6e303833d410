"""minispec: speculative decoding written out from scratch in NumPy (CPU) and CuPy (NVIDIA GPU).

A small draft proposes gamma tokens, the target checks them all in one forward pass, and
`verify` keeps each draft x with probability min(1, p(x)/q(x)), resampling the first rejected one
from norm(max(0, p - q)): the output follows the target's distribution exactly (Leviathan et al.
2023; Chen et al. 2023).

    import minispec
    target, draft = minispec.load("shipped:target"), minispec.load("shipped:draft")
    ids = target.tokenizer.encode("def fib(n):")
    out = minispec.speculative_generate(target, draft, ids, max_new_tokens=64, temperature=0)
    print(target.tokenizer.decode(out.tokens), out.stats.acceptance_rate)
"""

from .config import ModelConfig
from .core.drafter import Draft, Drafter, ModelDrafter, NoDrafter
from .core.model import KVCache, Model
from .core.sampling import Sampling, sample, warp
from .core.speculative import (
    GenerationResult,
    Request,
    Stats,
    autoregressive_generate,
    generate,
    speculative_generate,
)
from .core.verify import verify
from .errors import MinispecError
from .loader import load, random_model

__version__ = "0.1.0"

__all__ = [
    "DeviceRounds",
    "Draft",
    "Drafter",
    "GenerationResult",
    "KVCache",
    "MinispecError",
    "Model",
    "ModelConfig",
    "ModelDrafter",
    "NoDrafter",
    "Request",
    "Sampling",
    "Stats",
    "autoregressive_generate",
    "generate",
    "generate_batch",
    "load",
    "make_drafter",
    "random_model",
    "sample",
    "speculative_generate",
    "use_speed_path",
    "verify",
    "warp",
]

# Built around the core, imported when first used: importing the lesson (minispec.core) loads
# none of them (tests/test_core.py).
_EXTENSIONS = {"DeviceRounds": ("device_rounds", "DeviceRounds"),
               "generate_batch": ("batch", "generate_batch"),
               "make_drafter": ("drafters", "make_drafter"),
               "use_speed_path": ("cpu_steps", "enable_where_supported")}


def __getattr__(name: str):
    if name in _EXTENSIONS:
        import importlib

        module, attr = _EXTENSIONS[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'minispec' has no attribute {name!r}")
