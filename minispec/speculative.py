"""Speculative decoding (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

A cheap drafter guesses gamma tokens; the target scores all of them in one call; `verify` keeps
the longest prefix the target agrees with, in a way that leaves the output distributed exactly as
if the target had sampled every token itself. Autoregressive decoding lives here too, as the same
loop with no drafter: one target call per token. Both share the argument checks, the warping, the
KV-cache handling and the stopping rules, written once in `_generate`.
"""

from __future__ import annotations

import numpy as np

from .errors import MinispecError
from .sampling import sample


def verify(p, q, draft_tokens, rng: np.random.Generator) -> np.ndarray:
    """The speculative step: which draft tokens to keep, and the one token the target adds.

    p [g+1, V] float64: the target's (warped) distributions at each draft position and one past;
    q [g, V] float64: the distributions the draft tokens were drawn from; draft_tokens [g] int64;
    rng: the Generator that supplies every random number. g may be 0.
    Returns the emitted tokens, int64 [1..g+1]: the accepted prefix of the drafts, then either a
    correction (sampled after the first rejection) or, if all g were accepted, a bonus token.

    Leviathan et al. 2023, Algorithm 1 and section 2.3; Chen et al. 2023, Algorithm 2. For each
    draft x_i ~ q_i: draw r ~ U(0, 1), accept x_i if r < min(1, p_i(x) / q_i(x)). At the first
    rejection, sample from norm(max(0, p_i - q_i)) instead and stop; if nothing was rejected,
    sample one more token from p_g. Why this is lossless: P(emit x) = min(p(x), q(x)) (accepted)
    + (1 - sum_y min(p(y), q(y))) * norm(max(0, p - q))(x) (rejected, resampled) = p(x), for any
    q (Leviathan et al., Appendix A.1; Chen et al., Theorem 1). With greedy (one-hot) p and q a
    draft is accepted iff it is the target's argmax, and the correction is that argmax.
    """
    g = len(draft_tokens)
    if p.ndim != 2 or p.shape[0] != g + 1 or q.shape != (g, p.shape[1]):
        raise MinispecError(
            f"verify: expected p [g+1, V], q [g, V] for g = {g} draft tokens, "
            f"got p {p.shape} and q {q.shape}"
        )
    emitted = []
    for i in range(g):
        x = int(draft_tokens[i])
        r = rng.random()  # U[0, 1)
        # Accept with probability min(1, p(x)/q(x)), written r*q(x) < p(x) so that nothing is
        # divided by zero: p(x) = 0 never accepts (strict <), and a draft the drafter claimed
        # impossible, q(x) = 0, is accepted whenever the target allows it (the limit p/q -> inf).
        if r * q[i, x] < p[i, x]:
            emitted.append(x)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)  # where the target wants more than was drafted
        mass = residual.sum()
        # mass 0 means p == q (numerically), where a rejection can only come from q(x) = 0 = p(x):
        # the residual is then p itself.
        emitted.append(sample(residual / mass if mass > 0 else p[i], rng))
        return np.array(emitted, dtype=np.int64)
    emitted.append(sample(p[g], rng))  # all accepted: the bonus token, from the target for free
    return np.array(emitted, dtype=np.int64)
