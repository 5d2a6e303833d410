"""minispec/backend.py: the one CPU speed path of the math (backend.matmul, few_rows_matmul)
against a plain `x @ w`, at the shipped target's shapes, where its blocking branches are taken."""

import numpy as np
import pytest

from minispec.backend import SMALL_GEMM, few_rows_matmul, matmul

D, F, V = 512, 1376, 4096  # weights/target: width, MLP width, vocabulary (tied LM head)
RNG = np.random.default_rng(0)
W_UP = (RNG.standard_normal((D, F)) / np.sqrt(D)).astype(np.float32)  # [D, F], C-contiguous
W_DOWN = (RNG.standard_normal((F, D)) / np.sqrt(F)).astype(np.float32)  # [F, D]
EMBED = RNG.standard_normal((V, D), dtype=np.float32)
LM_HEAD = EMBED.T  # [D, V]: a transposed view, as a tied head is


@pytest.mark.parametrize("t", range(2, 17))
@pytest.mark.parametrize("name, w", [("up", W_UP), ("down", W_DOWN), ("tied head", LM_HEAD)])
def test_few_rows_equal_a_plain_matmul(t, name, w):
    x = RNG.standard_normal((t, w.shape[0]), dtype=np.float32)
    expected = x.astype(np.float64) @ w.astype(np.float64)
    got = few_rows_matmul(x, w)
    assert got.shape == (t, w.shape[1]) and got.dtype == np.float32
    # float32 sums in another order: the error is round-off, far below one unit of the result
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-4 * np.abs(expected).max())
    np.testing.assert_allclose(got, x @ w, rtol=0, atol=2e-4 * np.abs(expected).max())


def test_the_blocks_really_are_taken_at_these_shapes():
    # the premise of the tests above: at D = 512 the input-slice branch splits w into slices
    # (k * t * F > SMALL_GEMM for the largest k), and the tied head is a transposed view
    assert 64 * 16 * F > SMALL_GEMM
    assert LM_HEAD.flags.f_contiguous and not LM_HEAD.flags.c_contiguous


@pytest.mark.parametrize("t", [17, 40])
def test_many_rows_through_a_transposed_head_equal_a_plain_matmul(t):
    x = RNG.standard_normal((t, D), dtype=np.float32)
    expected = x.astype(np.float64) @ LM_HEAD.astype(np.float64)
    np.testing.assert_allclose(matmul(x, LM_HEAD), expected, rtol=0,
                               atol=2e-4 * np.abs(expected).max())


def test_matmul_routes_only_few_float32_rows():
    w = W_UP[:, :64]
    for t, dtype in [(1, np.float32), (17, np.float32), (4, np.float64), (4, np.float16)]:
        x = RNG.standard_normal((t, D)).astype(dtype)
        np.testing.assert_array_equal(matmul(x, w.astype(dtype)), x @ w.astype(dtype))
    x = RNG.standard_normal((5, D), dtype=np.float32)
    np.testing.assert_allclose(matmul(x, w), x @ w, rtol=1e-5, atol=1e-5)
