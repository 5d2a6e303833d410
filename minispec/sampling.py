"""From logits to probabilities and back to a token: temperature, top-k, top-p, and one draw.

Speculative sampling is lossless for whatever distribution the target samples from, so the warping
(temperature, top-k, top-p) is part of that distribution: the target's logits p and the drafter's
logits q go through the same `warp` (Leviathan et al. 2023, section 3.1 note on "sampling
techniques"; Chen et al. 2023, section 2.3). Temperature 0 is greedy decoding, written as a
one-hot distribution at the argmax, so greedy decoding is the same algorithm with peaky p and q.

Everything here runs on the host in float64: a row of V probabilities is small, and float64 keeps
`max(0, p - q)` free of float32 round-off. Randomness comes in as a `numpy.random.Generator`.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from .backend import to_host
from .errors import MinispecError


def check_sampling_params(temperature: float, top_k: int = 0, top_p: float = 1.0) -> None:
    """Raise MinispecError naming the parameter if temperature, top_k or top_p is out of range."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, Real)
        or not (math.isfinite(temperature) and temperature >= 0)
    ):
        raise MinispecError(f"temperature: expected a number >= 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 0:
        raise MinispecError(f"top_k: expected an integer >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, Real) or not 0 < top_p <= 1:
        raise MinispecError(f"top_p: expected a number in (0, 1] (1 = off), got {top_p!r}")


def warp(logits, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Logits [..., V] (NumPy or CuPy) -> probabilities [..., V], float64 NumPy, rows sum to 1.

    temperature 0: one-hot at the argmax (the first one on ties, as `np.argmax`), i.e. greedy.
    top_k > 0: keep the k largest logits, zero the rest.
    top_p < 1: keep the smallest set of most probable tokens whose mass is >= top_p (nucleus
    sampling); at least one token is kept.
    In both, tokens tied with the last one kept are kept too. Top-k is applied before top-p,
    both after temperature, as in Hugging Face `generate`.
    """
    check_sampling_params(temperature, top_k, top_p)
    logits = to_host(logits)
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise MinispecError(f"logits: expected shape [..., V] with V >= 1, got {logits.shape}")
    if temperature == 0:
        probs = np.zeros(logits.shape)
        np.put_along_axis(probs, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return probs
    x = logits.astype(np.float64)  # our own copy, changed in place below
    x /= temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = np.partition(x, V - top_k, axis=-1)[..., V - top_k, None]  # k-th largest logit
        x[x < kth] = -np.inf
    x -= x.max(axis=-1, keepdims=True)  # softmax, shifted so the largest exp is 1
    probs = np.exp(x, out=x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1:
        desc = np.sort(probs, axis=-1)[..., ::-1]  # most probable first
        mass_before = np.cumsum(desc, axis=-1) - desc
        # a token is in the nucleus iff the more probable ones have not yet reached top_p
        n = (mass_before < top_p).sum(axis=-1, keepdims=True)  # >= 1: mass_before[0] = 0
        probs[probs < np.take_along_axis(desc, n - 1, axis=-1)] = 0.0
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample(probs, rng: np.random.Generator) -> int:
    """One token id drawn from the probability row `probs` [V] (>= 0, sums to 1), using `rng`.

    Inverse-CDF sampling with one uniform draw (llama2.c's `sample_mult`), over the tokens with
    nonzero probability only: after greedy, top-k or top-p warping that is a handful of ids.
    """
    support = np.flatnonzero(probs > 0)
    cdf = np.cumsum(probs[support])
    r = rng.random() * cdf[-1]  # scaled by the total, so round-off in the sum does not matter
    i = int(np.searchsorted(cdf, r, side="right"))  # the first token whose cdf passes r
    return int(support[min(i, len(support) - 1)])  # min: in case r rounded up to the total
