"""Tests for minispec/core/sampling.py: warp (temperature, top-k, top-p) and sample."""

import numpy as np
import pytest
from scipy.stats import chisquare

from minispec.core.sampling import check_sampling_params, sample, warp
from minispec.errors import MinispecError


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_temperature_zero_is_one_hot_at_argmax():
    logits = np.random.default_rng(0).normal(size=(5, 11)).astype(np.float32)
    probs = warp(logits, 0.0)
    assert probs.dtype == np.float64 and probs.shape == (5, 11)
    assert np.array_equal(probs.argmax(-1), logits.argmax(-1))
    assert np.array_equal(probs.sum(-1), np.ones(5))
    assert np.count_nonzero(probs) == 5


def test_temperature_zero_breaks_ties_at_first_index():
    assert warp(np.array([1.0, 3.0, 3.0, 2.0]), 0).tolist() == [0, 1, 0, 0]


def test_temperature_zero_ignores_top_k_and_top_p():
    logits = np.array([0.0, 5.0, 1.0])
    assert warp(logits, 0, top_k=2, top_p=0.1).tolist() == [0, 1, 0]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_scales_logits(temperature):
    logits = np.random.default_rng(1).normal(size=(3, 20))
    np.testing.assert_allclose(warp(logits, temperature), softmax(logits / temperature))


def test_warp_does_not_modify_its_input():
    logits = np.random.default_rng(2).normal(size=(2, 9))
    before = logits.copy()
    warp(logits, 0.7, top_k=3, top_p=0.5)
    assert np.array_equal(logits, before)


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_top_k_keeps_the_k_largest(k):
    logits = np.random.default_rng(3).normal(size=(4, 10))
    probs = warp(logits, 1.0, top_k=k)
    assert (np.count_nonzero(probs, axis=-1) == k).all()
    top = np.argsort(-logits, axis=-1)[:, :k]
    expected = np.zeros_like(logits)
    for row in range(4):
        expected[row, top[row]] = softmax(logits[row, top[row]])
    np.testing.assert_allclose(probs, expected)


def test_top_k_at_least_vocab_is_off():
    logits = np.random.default_rng(4).normal(size=8)
    np.testing.assert_allclose(warp(logits, 1.0, top_k=8), softmax(logits))
    np.testing.assert_allclose(warp(logits, 1.0, top_k=100), softmax(logits))


@pytest.mark.parametrize(
    "top_p, kept",
    [(1e-9, [0]), (0.4, [0]), (0.75, [0, 1]), (0.81, [0, 1, 2]), (0.96, [0, 1, 2, 3])],
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, kept):
    base = np.array([0.5, 0.3, 0.15, 0.05])
    perm = np.array([2, 0, 3, 1])  # scramble the order: the nucleus is by probability, not id
    logits = np.log(base[perm])
    probs = warp(logits, 1.0, top_p=top_p)
    expected = np.zeros(4)
    ids = [int(np.flatnonzero(perm == i)[0]) for i in kept]
    expected[ids] = base[kept] / base[kept].sum()
    np.testing.assert_allclose(probs, expected)


def test_top_p_always_keeps_one_token():
    probs = warp(np.array([0.0, 0.0, 10.0]), 1.0, top_p=1e-12)
    assert probs.tolist() == [0, 0, 1]


def test_top_k_then_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top_k=3 renormalizes to [4/9, 3/9, 2/9]; top_p=0.7 needs 4/9 + 3/9 = 0.78
    probs = warp(logits, 1.0, top_k=3, top_p=0.7)
    np.testing.assert_allclose(probs, [4 / 7, 3 / 7, 0, 0])


@pytest.mark.parametrize("temperature", [0, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.5), (4, 0.9)])
def test_rows_sum_to_one(temperature, top_k, top_p):
    logits = np.random.default_rng(5).normal(scale=4, size=(6, 30)).astype(np.float32)
    probs = warp(logits, temperature, top_k, top_p)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert (probs >= 0).all()


def test_warp_of_a_single_row():
    assert warp(np.array([1.0, 2.0]), 1.0).shape == (2,)


@pytest.mark.parametrize("temperature", [0, 0.7, 1.0])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (50, 1.0), (0, 0.8), (20, 0.9)])
def test_each_row_of_a_matrix_is_warped_as_if_alone(temperature, top_k, top_p):
    """A batch warps every sequence's rows in one call (minispec/batch.py): each row's
    probabilities are the bits that row alone gets (a sequence's output must not depend on its
    company)."""
    logits = np.random.default_rng(9).normal(scale=3, size=(16, 4096)).astype(np.float32)
    together = warp(logits, temperature, top_k, top_p)
    for row, got in zip(logits, together):
        assert np.array_equal(got, warp(row, temperature, top_k, top_p))


def test_sample_frequencies_match_probs():
    probs = np.array([0.1, 0.0, 0.2, 0.3, 0.4, 0.0])
    rng = np.random.default_rng(6)
    n = 20_000
    counts = np.bincount([sample(probs, rng) for _ in range(n)], minlength=6)
    assert counts[1] == counts[5] == 0  # probability 0 is never drawn
    support = probs > 0
    assert chisquare(counts[support], n * probs[support]).pvalue > 1e-3


def test_sample_is_deterministic_for_a_seed():
    probs = softmax(np.random.default_rng(7).normal(size=50))
    draws = [
        [sample(probs, rng) for _ in range(20)] for rng in map(np.random.default_rng, [8, 8, 9])
    ]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]


def test_sample_one_hot():
    rng = np.random.default_rng(9)
    assert {sample(np.array([0.0, 0.0, 1.0, 0.0]), rng) for _ in range(100)} == {2}


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 1.0, "top_k": -1}, "top_k"),
        ({"temperature": 1.0, "top_k": 1.5}, "top_k"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
        ({"temperature": 1.0, "top_p": -0.2}, "top_p"),
    ],
)
def test_bad_sampling_parameters_are_named(kwargs, name):
    with pytest.raises(MinispecError, match=name):
        check_sampling_params(**kwargs)
    with pytest.raises(MinispecError, match=name):
        warp(np.zeros(4), **kwargs)


@pytest.mark.parametrize("logits, match", [
    (np.array(["a", "b"]), "numbers"), ([[1.0], [1.0, 2.0]], "numbers"), (np.zeros((2, 0)), "V"),
    ([[1.0, float("nan")]], "NaN"), ([0.0, float("inf")], "NaN or \\+inf"),
    ([-np.inf, -np.inf], "only -inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bad_logits_are_one_clear_error(logits, match, temperature):
    """Greedy and sampled warps refuse the same inputs, each with a MinispecError naming them."""
    with pytest.raises(MinispecError, match=f"logits.*{match}"):
        warp(logits, temperature)


def test_logits_of_other_number_types_are_read_as_float64():
    from fractions import Fraction

    logits = np.array([Fraction(1, 3), Fraction(2, 3), Fraction(-1)], dtype=object)
    for t in (0.0, 1.0):
        np.testing.assert_array_equal(warp(logits, t), warp(logits.astype(np.float64), t))


def test_greedy_warp_of_float32_logits_is_the_argmax_of_their_float64_values():
    """Greedy warp reads the logits as they come (no float64 copy): the same one-hot rows, ties to
    the first index, as the float64 values give."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((6, 300)).astype(np.float32)
    logits[2, [7, 9]] = logits[2].max() + 1  # a tie
    want = np.zeros(logits.shape)
    want[np.arange(6), logits.astype(np.float64).argmax(axis=1)] = 1.0
    got = warp(logits, 0.0)
    assert got.dtype == np.float64 and np.array_equal(got, want) and got[2, 7] == 1.0
