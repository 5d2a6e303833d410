"""Hugging Face transformers' speculative sampling step, behind minispec's `verify` signature.

So that `verify_distribution.py` can judge it with the same tests as minispec's own:

    python verify_distribution.py --sampler minispec.hf_adapter:verify

transformers implements Leviathan et al. Algorithm 1 in a private function, `_speculative_sampling`
(transformers/generation/utils.py), which takes logits as torch tensors with a batch dimension and
draws with torch's global generator. This adapter hands it log-probabilities (softmax(log p) = p),
seeds torch from the numpy Generator on every call so that a seeded run replays, and converts the
result back. Needs torch and transformers; minispec itself never imports this module.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable

import numpy as np

from .errors import MinispecError

REQUIRES = ("torch", "transformers")  # verify_distribution checks these before judging


@functools.cache
def find_speculative_sampling() -> Callable:
    """transformers' `_speculative_sampling`, wherever this version keeps it.

    Also sets torch to one thread: the tensors here are a few rows of V numbers, and on a busy
    machine torch's thread pool made each call ~100x slower.
    """
    torch, generation = _import("torch"), _import("transformers.generation")
    if torch is None or generation is None:
        raise MinispecError("minispec.hf_adapter needs transformers and torch "
                            "(pip install 'minispec[parity]')")
    torch.set_num_threads(1)
    for name in ["utils"] + [m.name for m in pkgutil.iter_modules(generation.__path__)]:
        fn = getattr(_import(f"transformers.generation.{name}"), "_speculative_sampling", None)
        if callable(fn):
            return fn
    raise MinispecError("minispec.hf_adapter: no _speculative_sampling in any module of "
                        "transformers.generation (has this transformers version moved it?)")


def verify(p, q, draft_tokens, rng: np.random.Generator) -> np.ndarray:
    """minispec's verify signature around transformers' `_speculative_sampling`.

    p float64 [g+1, V], q float64 [g, V], draft_tokens int64 [g], rng a numpy Generator;
    returns the emitted tokens, int64 [1..g+1].
    """
    import torch

    fn = find_speculative_sampling()
    # transformers draws from torch's global CPU generator (torch.manual_seed would also seed
    # every accelerator, and is slow)
    torch.default_generator.manual_seed(int(rng.integers(2**63)))
    g = len(draft_tokens)
    if g == 0:
        # transformers never calls the step without candidates (it would slice the whole prompt
        # as candidates): with nothing drafted, generation samples from the target directly
        return np.array([int(torch.multinomial(torch.tensor(p[0]), 1))], dtype=np.int64)
    with np.errstate(divide="ignore"):  # log 0 = -inf, and softmax(-inf) = 0 again
        new_logits = torch.from_numpy(np.log(np.asarray(p, np.float64)))[None]  # [1, g+1, V]
        candidate_logits = torch.from_numpy(np.log(np.asarray(q, np.float64)))[None]  # [1, g, V]
    candidate_ids = torch.as_tensor(np.asarray(draft_tokens, dtype=np.int64))[None]  # [1, g]
    kwargs = {"is_done_candidate": False} if _takes_is_done(fn) else {}  # transformers 4.x
    tokens, _ = fn(candidate_ids, candidate_logits, g, new_logits, **kwargs)
    return tokens[0].numpy().astype(np.int64)


@functools.cache
def _takes_is_done(fn: Callable) -> bool:
    return "is_done_candidate" in inspect.signature(fn).parameters


def _import(name: str):
    """The module, or None where it (or one of its optional dependencies) is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
