"""Outside verify steps for tests/test_verify_distribution.py: one exact, two broken.

Each has minispec's verify signature, fn(p, q, draft_tokens, rng) -> emitted tokens, and is
written independently of minispec (all uniforms drawn up front, inverse-CDF sampling by hand), as
an outside implementation handed to `verify_distribution.py --sampler` would be.
"""

from __future__ import annotations

import numpy as np


def _draw(probs: np.ndarray, u: float) -> int:
    cdf = np.cumsum(probs / probs.sum())
    return int(min(np.searchsorted(cdf, u, side="right"), np.flatnonzero(probs > 0)[-1]))


def _algorithm1(p, q, draft_tokens, rng, *, residual_is_p=False, drop_bonus=False):
    g = len(draft_tokens)
    u = rng.random(g + 1)  # g acceptance coins, one draw for the last token
    for i, x in enumerate(draft_tokens):
        if u[i] * q[i, x] >= p[i, x]:  # rejected: r >= p/q
            residual = p[i] if residual_is_p else np.maximum(p[i] - q[i], 0.0)
            return np.append(draft_tokens[:i], _draw(residual, u[g])).astype(np.int64)
    if drop_bonus and g > 0:
        return np.asarray(draft_tokens, dtype=np.int64)
    return np.append(draft_tokens, _draw(p[g], u[g])).astype(np.int64)


def exact(p, q, draft_tokens, rng):
    """Leviathan et al. Algorithm 1: should pass."""
    return _algorithm1(p, q, draft_tokens, rng)


def residual_is_p(p, q, draft_tokens, rng):
    """Resamples from p after a rejection: not lossless, should fail."""
    return _algorithm1(p, q, draft_tokens, rng, residual_is_p=True)


def drop_bonus(p, q, draft_tokens, rng):
    """Drops the bonus token: emits the right tokens, too few per round; should fail."""
    return _algorithm1(p, q, draft_tokens, rng, drop_bonus=True)
