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

from .batch import generate_batch
from .config import ModelConfig
from .drafters import Draft, Drafter, ModelDrafter, NoDrafter, make_drafter
from .errors import MinispecError
from .loader import load, random_model
from .model import KVCache, Model
from .sampling import Sampling, sample, warp
from .speculative import (
    GenerationResult,
    Request,
    Stats,
    autoregressive_generate,
    generate,
    speculative_generate,
)
from .verify import verify

__version__ = "0.1.0"

__all__ = [
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
    "verify",
    "warp",
]
