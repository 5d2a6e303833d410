"""From logits to probabilities and back to a token: temperature, top-k, top-p, and one draw.

Speculative sampling is lossless for whatever distribution the target samples from, so the warping
(temperature, top-k, top-p) is part of that distribution: the target's logits p and the drafter's
logits q go through the same `warp` (Leviathan et al. 2023, section 3.1 note on "sampling
techniques"; Chen et al. 2023, section 2.3). Temperature 0 is greedy decoding, written as a
one-hot distribution at the argmax, so greedy decoding is the same algorithm with peaky p and q.

`Sampling` carries the three settings as one value (the API, the command line and the benchmarks
all pass it around); `warp` and `sample` are the functions. Everything here runs on the host in
float64: a row of V probabilities is small, and float64 keeps `max(0, p - q)` free of float32
round-off. Randomness comes in as a `numpy.random.Generator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from ..backend import to_host
from ..errors import MinispecError


@dataclass(frozen=True)
class Sampling:
    """How a distribution is drawn from: temperature (0 = greedy), top_k (0 = off), top_p (1 =
    off). Checked when made; MinispecError names the bad field."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, Real) or not _finite(t) or float(t) < 0:
            raise MinispecError(f"temperature: expected a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 0:
            raise MinispecError(f"top_k: expected an integer >= 0 (0 = off), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, Real) or not _finite(p) or not 0 < p <= 1:
            raise MinispecError(f"top_p: expected a number in (0, 1] (1 = off), got {p!r}")
        # plain Python numbers from here on (a Fraction or numpy scalar would leak into the math)
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_k", int(k))
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def warp(self, logits) -> np.ndarray:
        """warp(logits, temperature, top_k, top_p) with these settings."""
        return _warp(logits, self.temperature, self.top_k, self.top_p)


def _finite(x) -> bool:
    try:
        return math.isfinite(x)
    except (OverflowError, TypeError, ValueError):  # a Fraction beyond float range, say
        return False


def check_sampling_params(temperature: float, top_k: int = 0, top_p: float = 1.0) -> None:
    """Raise MinispecError naming the parameter if temperature, top_k or top_p is out of range."""
    Sampling(temperature, top_k, top_p)


def warp(logits, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Logits [..., V] (NumPy or CuPy) -> probabilities [..., V], float64 NumPy, rows sum to 1.

    temperature 0: one-hot at the argmax (the first one on ties, as `np.argmax`), i.e. greedy.
    top_k > 0: keep the k largest logits, zero the rest.
    top_p < 1: keep the smallest set of most probable tokens whose mass is >= top_p (nucleus
    sampling); at least one token is kept.
    In both, tokens tied with the last one kept are kept too. Top-k is applied before top-p,
    both after temperature, as in Hugging Face `generate`. A logit of -inf is probability 0;
    NaN or +inf (a broken model) raises MinispecError.
    """
    s = Sampling(temperature, top_k, top_p)
    return _warp(logits, s.temperature, s.top_k, s.top_p)


def _warp(logits, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    try:
        logits = to_host(logits)
    except (TypeError, ValueError) as e:  # a ragged list, say
        raise MinispecError(f"logits: expected an array of numbers ({e})") from None
    if logits.dtype.kind not in "biuf":  # objects, a bfloat16 of ml_dtypes, ...: as float64
        try:
            logits = logits.astype(np.float64)
        except (TypeError, ValueError):
            raise MinispecError(f"logits: expected an array of numbers, got dtype "
                                f"{logits.dtype}") from None
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise MinispecError(f"logits: expected shape [..., V] with V >= 1, got {logits.shape}")
    top = logits.max(axis=-1, keepdims=True)  # [..., 1]
    if not np.isfinite(top).all():  # max() is NaN if any entry is, +inf if any is
        raise MinispecError("logits: NaN or +inf (or a row of only -inf) in a model's output; "
                            "the weights or the arithmetic overflowed")
    if temperature == 0:
        probs = np.zeros(logits.shape)
        np.put_along_axis(probs, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return probs
    x = logits.astype(np.float64)  # our own copy, changed in place below
    x -= top  # shifted so the largest is 0: dividing by a tiny temperature can only send the
    with np.errstate(over="ignore"):  # others to -inf (probability 0), which is the limit
        x /= temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = np.partition(x, V - top_k, axis=-1)[..., V - top_k, None]  # k-th largest logit
        x[x < kth] = -np.inf
    probs = np.exp(x, out=x)  # softmax; the largest term is exp(0) = 1
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
    if support.size == 0:
        raise MinispecError(f"sample: the probability row (length {len(probs)}) has no "
                            "positive entry")
    cdf = np.cumsum(probs[support])
    r = rng.random() * cdf[-1]  # scaled by the total, so round-off in the sum does not matter
    i = int(np.searchsorted(cdf, r, side="right"))  # the first token whose cdf passes r
    return int(support[min(i, len(support) - 1)])  # min: in case r rounded up to the total
