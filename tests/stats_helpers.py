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
