"""The speculative step: which draft tokens to keep, and the one token the target adds.

Leviathan et al. 2023, Algorithm 1 and section 2.3; Chen et al. 2023, Algorithm 2. A pure function
of arrays and a random generator, so it can be tested alone and swapped: `speculative_generate`
takes any function with this signature as its `verify` parameter.

The words, as minispec and its docs use them:
  drafted     the g tokens a drafter proposed this round (x_1..x_g), each drawn from its row of q
  accepted    the drafts the target kept: always a prefix of the drafted (0..g of them; as a
              count, Round.accepted, how many)
  correction  the token drawn from norm(max(0, p - q)) in place of the first rejected draft
  bonus       the token drawn from the target's own p after the last draft, when all g were kept
  emitted     what a round adds to the output: the accepted drafts, then the correction or bonus
  positions   the depth of what was drafted: g for a chain (a tree's deepest path, minispec/tree.py)
  p, q        the target's and the drafter's distributions after warping (sampling.py): rows of V
              probabilities; p has one row more than q, the row after the last draft
  verify      this step alone; the round's target call is the drafter's `target_forward`
  gamma       the drafts a round asks for (the drafter may propose fewer, g <= gamma)
  warp        logits -> the distribution to sample: `warp(logits, temperature, top_k, top_p)`;
              a drafter receives it with the settings bound, as a function of logits alone
              (speculative.make_warp, which also pads a narrower draft vocabulary with zeros)
  V           the token ids generation samples from: the target's vocabulary without embedding
              rows padded past its tokenizer (drafter.sampled_vocab_size)
  context     the prompt and every token emitted so far; the target's cache holds all but the
              last (`unseen`: the tokens of it the cache lacks, fed by the next target call)
"""

from __future__ import annotations

import numpy as np

from .checks import check_verify_args
from .sampling import sample


def verify(p, q, draft_tokens, rng: np.random.Generator) -> np.ndarray:
    """Keep a prefix of the drafts, then add the target's own token.

    p [g+1, V]: the target's (warped) distributions at each draft position and one past;
    q [g, V]: the distributions the draft tokens were drawn from; draft_tokens [g] int;
    rng: the Generator that supplies every random number. g may be 0.
    Returns the emitted tokens, int64 [1..g+1]: the accepted prefix of the drafts, then either a
    correction (sampled after the first rejection) or, if all g were accepted, a bonus token.

    For each draft x_i ~ q_i: draw r ~ U(0, 1), accept x_i if r < min(1, p_i(x) / q_i(x)). At the
    first rejection, sample from norm(max(0, p_i - q_i)) instead and stop; if nothing was
    rejected, sample one more token from p_g. Why this is lossless: P(emit x) = min(p(x), q(x))
    (accepted) + (1 - sum_y min(p(y), q(y))) * norm(max(0, p - q))(x) (rejected, resampled) =
    p(x), for any q (Leviathan et al., Appendix A.1; Chen et al., Theorem 1). With greedy
    (one-hot) p and q a draft is accepted iff it is the target's argmax, and the correction is
    that argmax.
    """
    p, q, draft_tokens = check_verify_args(p, q, draft_tokens, rng)
    g = len(draft_tokens)
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
