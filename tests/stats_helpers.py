"""Statistics shared by the tests that check sampled output against an exact distribution."""

import numpy as np
from scipy.stats import chisquare


def pooled_chisquare(counts, expected, min_expected=5.0):
    """Chi-square p-value, cells with expected count < min_expected pooled into one."""
    small = expected < min_expected
    assert counts[expected == 0].sum() == 0  # nothing outside the target's support
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def sample_joint(target, drafter, n, *, top_k, L, prompt=(1, 5, 9), gamma=3):
    """`n` speculative generations of L tokens at T = 1 with top-k (seeds 0..n-1) against the
    exact law of those L tokens (minispec.judge's joint test) -> (the test's row, the samples)."""
    import minispec
    from minispec.judge.stats import E2E, exact_joint, joint_row

    samples = []
    for seed in range(n):
        out = minispec.speculative_generate(target, drafter, list(prompt), gamma=gamma,
                                            max_new_tokens=L, temperature=1.0, top_k=top_k,
                                            seed=seed)
        samples.append(tuple(out.tokens))
    cfg = E2E(1.0, top_k=top_k, L=L, draft="near")
    return joint_row("D", drafter.name, exact_joint(target, list(prompt), cfg), samples), samples
