"""The verify step (minispec/core/verify.py) alone: a pure function of arrays and a Generator.

The compact statistical test is test_emitted_tokens_follow_the_target_exactly: with every
probability known, the emitted tokens follow the target's p (Leviathan et al. 2023, Appendix A.1;
Chen et al. 2023, Theorem 1), the corrections norm(max(0, p - q)), and drafts are kept with
probability sum min(p, q). The rest pins the edge cases: greedy p and q, q = 0, p = 0, p = q,
disjoint supports, bad arguments named.
"""

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from minispec.core.sampling import sample
from minispec.core.verify import verify
from minispec.errors import MinispecError


def one_hot(i, V):
    row = np.zeros(V)
    row[i] = 1.0
    return row


def random_probs(rng, V, zeros=0):
    p = rng.dirichlet(np.ones(V))
    p[rng.choice(V, size=zeros, replace=False)] = 0.0
    return p / p.sum()


def assert_distributed_as(tokens, probs, pvalue=1e-3):
    """Chi-square goodness of fit of integer samples `tokens` to `probs`; none off its support."""
    counts = np.bincount(tokens, minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], len(tokens) * probs[support]).pvalue > pvalue


def test_verify_with_no_drafts_samples_from_p():
    p = np.array([[0.0, 0.0, 1.0]])
    out = verify(p, np.empty((0, 3)), np.empty(0, dtype=np.int64), np.random.default_rng(0))
    assert out.dtype == np.int64 and out.tolist() == [2]


def test_verify_rejects_bad_shapes():
    p, q, d = np.full((3, 4), 0.25), np.full((2, 4), 0.25), np.array([0, 1])
    rng = np.random.default_rng(0)
    for args in [(p[:2], q, d), (p, q[:, :3], d), (p, q, d[:1]), (p[0], q, d)]:
        with pytest.raises(MinispecError, match="verify"):
            verify(*args, rng)


def _bad_verify_args():
    p, q, d = np.full((3, 4), 0.25), np.full((2, 4), 0.25), np.array([0, 1])
    nan, inf, neg, zero = p.copy(), q.copy(), q.copy(), q.copy()
    nan[1, 2] = np.nan
    inf[1, 0] = np.inf
    neg[0] = [0.5, 0.5, 0.5, -0.5]
    zero[1] = 0.0
    return [
        ((nan, q, d), "finite"), ((p, inf, d), "finite"), ((p, neg, d), ">= 0"),
        ((p, zero, d), "sum to 1"),
        ((p * 0.9, q, d), "sum to 1"), ((p, q, np.array([0, 4])), "outside the vocabulary"),
        ((p, q, np.array([-1, 0])), "outside the vocabulary"),
        ((p, q, np.array([0.0, 1.0])), "integer"), ((np.zeros((1, 0)), np.zeros((0, 0)), []), "V"),
        ((p, q, [[0, 1]]), "1-D"), ((p, "q", d), "arrays of numbers"),
    ]


@pytest.mark.parametrize("args, match", _bad_verify_args())
def test_verify_rejects_bad_values_naming_them(args, match):
    with pytest.raises(MinispecError, match=match):
        verify(*args, np.random.default_rng(0))


def test_verify_takes_lists_and_needs_a_generator():
    p, q = [[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0]]
    assert verify(p, q, [1], np.random.default_rng(0))[0] in (0, 1)
    with pytest.raises(MinispecError, match="rng"):
        verify(np.array(p), np.array(q), np.array([1]), None)


def test_greedy_one_hot_p_equals_q_accepts_every_draft():
    V, drafts = 6, [3, 1, 4]
    p = np.stack([one_hot(t, V) for t in drafts + [5]])
    q = p[:3].copy()
    for seed in range(50):
        out = verify(p, q, np.array(drafts), np.random.default_rng(seed))
        assert out.tolist() == [3, 1, 4, 5]  # all accepted, then the bonus argmax


def test_greedy_accepts_up_to_the_first_mismatch_and_corrects_with_argmax():
    V = 5
    target = [2, 0, 4, 1]  # the target's argmax at each position
    drafts = [2, 0, 3]  # the third draft disagrees
    p = np.stack([one_hot(t, V) for t in target])
    q = np.stack([one_hot(t, V) for t in drafts])
    for seed in range(50):
        out = verify(p, q, np.array(drafts), np.random.default_rng(seed))
        assert out.tolist() == [2, 0, 4]


def test_p_equal_q_accepts_with_probability_one():
    rng = np.random.default_rng(1)
    V, g = 7, 4
    p = np.stack([random_probs(rng, V, zeros=2) for _ in range(g + 1)])
    q = p[:g].copy()
    for seed in range(200):
        r = np.random.default_rng(seed)
        drafts = np.array([sample(q[i], r) for i in range(g)])
        assert verify(p, q, drafts, r)[:g].tolist() == drafts.tolist()


def test_rejection_with_p_equal_q_falls_back_to_p():
    # A draft the drafter called impossible (q(x) = 0) that the target also rules out (p(x) = 0)
    # is rejected; max(0, p - q) is all zeros, so the correction comes from p, without a 0/0.
    p = np.array([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]])
    q = p[:1].copy()
    rng = np.random.default_rng(2)
    with np.errstate(all="raise"):
        firsts = [verify(p, q, np.array([0]), rng) for _ in range(4000)]
    assert all(len(out) == 1 for out in firsts)
    assert_distributed_as([int(out[0]) for out in firsts], p[0])


def test_draft_with_q_zero_is_accepted_where_the_target_allows_it():
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    q = np.array([[1.0, 0.0]])
    with np.errstate(all="raise"):
        out = verify(p, q, np.array([1]), np.random.default_rng(3))
    assert out.tolist() == [1, 0]


def test_target_probability_zero_is_never_accepted():
    p = np.array([[0.0, 1.0, 0.0], [1 / 3] * 3])
    q = np.array([[1.0, 0.0, 0.0]])  # even a certain draft is rejected when p(x) = 0
    for seed in range(100):
        assert verify(p, q, np.array([0]), np.random.default_rng(seed)).tolist() == [1]


def test_disjoint_supports_always_reject_and_sample_from_p():
    p = np.array([[0.0, 0.0, 0.2, 0.3, 0.5], [0.2] * 5])
    q = np.array([[0.6, 0.4, 0.0, 0.0, 0.0]])
    rng = np.random.default_rng(4)
    outs = [verify(p, q, np.array([sample(q[0], rng)]), rng) for _ in range(4000)]
    assert all(len(out) == 1 for out in outs)
    assert_distributed_as([int(out[0]) for out in outs], p[0])


def test_one_hot_q_accepts_with_probability_p_of_the_draft():
    # a deterministic drafter (n-gram style): q one-hot at x, accepted with probability p(x);
    # the correction is p without x, renormalized, so the first token is still ~ p
    p = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    q = np.array([one_hot(1, 3)])
    rng = np.random.default_rng(5)
    n = 5000
    outs = [verify(p, q, np.array([1]), rng) for _ in range(n)]
    accepted = sum(len(out) == 2 for out in outs)
    assert binomtest(accepted, n, 0.6).pvalue > 1e-3
    corrections = [int(out[0]) for out in outs if len(out) == 1]
    assert_distributed_as(corrections, np.array([0.25, 0.0, 0.75]))
    assert_distributed_as([int(out[0]) for out in outs], p[0])


def test_emitted_tokens_follow_the_target_exactly():
    # Small case with every probability known: g = 2 drafts x_i ~ q_i, V = 4.
    # P(accept x_1) = sum min(p_0, q_0); the first token ~ p_0; a correction ~ norm(max(0, p-q));
    # given the first draft was accepted, the second token ~ p_1; the bonus ~ p_2.
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.4, 0.1, 0.1], [0.0, 0.5, 0.0, 0.5]])
    q = np.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    rng = np.random.default_rng(6)
    n = 6000
    outs = []
    for _ in range(n):
        drafts = np.array([sample(q[0], rng), sample(q[1], rng)])
        outs.append((drafts, verify(p, q, drafts, rng)))
    first_accepted = [o for d, o in outs if len(o) >= 2]
    assert binomtest(len(first_accepted), n, np.minimum(p[0], q[0]).sum()).pvalue > 1e-3
    assert_distributed_as([int(o[0]) for _, o in outs], p[0])
    residual = np.maximum(p[0] - q[0], 0)
    assert_distributed_as([int(o[0]) for _, o in outs if len(o) == 1], residual / residual.sum())
    assert_distributed_as([int(o[1]) for o in first_accepted], p[1])
    assert_distributed_as([int(o[2]) for _, o in outs if len(o) == 3], p[2])
    for d, o in outs:  # the emitted prefix is exactly the accepted drafts
        assert o[: len(o) - 1].tolist() == d[: len(o) - 1].tolist()


def test_verify_is_deterministic_for_a_seed():
    rng = np.random.default_rng(7)
    p = np.stack([random_probs(rng, 50) for _ in range(5)])
    q = np.stack([random_probs(rng, 50) for _ in range(4)])
    drafts = np.array([3, 14, 15, 9])
    runs = [
        [verify(p, q, drafts, g).tolist() for _ in range(30)]
        for g in (np.random.default_rng(8), np.random.default_rng(8), np.random.default_rng(9))
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
