"""A batch's call through a CUDA graph (minispec/batch_graphs.py): on NumPy, every sequence's
rows equal the plain one-sequence recompute at its own position; the predicted crossover
against the closed form; on the GPU, the tensor-core product past 16 rows and the graphed
batch's call against the plain path."""

import numpy as np
import pytest
from conftest import FAMILIES, GPU, tiny_config

from minispec.backend import to_host
from minispec.batch_graphs import new_batch_cache, static_batch_hidden
from minispec.core.speculative import expected_tokens_per_call
from minispec.cuda_graphs import PlainKernels
from minispec.loader import random_model
from minispec.measure import crossover


def _batch_against_one_sequence(model, kernels, B=3, k=2):
    """Sequences with prefixes of different lengths, then k tokens each in one batch call:
    each sequence's rows against Model.hidden_states over its whole prefix + tokens."""
    xp = model.xp
    rng = np.random.default_rng(0)
    lengths = [(5 + 4 * b) % 11 + 1 for b in range(B)]  # 6, 10, 3, 7, 11, ...
    seqs = [rng.integers(0, model.vocab_size, n + k).tolist() for n in lengths]
    cache = new_batch_cache(model, B, 24)
    for b, (s, n) in enumerate(zip(seqs, lengths)):  # each prefix into its slice of the cache
        one = model.new_cache(24)
        model.hidden_states(s[:n], one)
        cache.k[:, b], cache.v[:, b] = one.k, one.v
    ids = xp.asarray(np.concatenate([s[n:] for s, n in zip(seqs, lengths)]))
    h = static_batch_hidden(model, kernels, ids, xp.asarray(lengths), k, cache)
    for b, (s, n) in enumerate(zip(seqs, lengths)):
        want = model.hidden_states(s, model.new_cache(24))[n:]  # the plain recompute
        yield to_host(h[b * k:(b + 1) * k]), to_host(want)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_sequence_of_a_batch_call_is_its_own_recompute(family):
    model = random_model(tiny_config(family), seed=0, scale=0.5)
    for got, want in _batch_against_one_sequence(model, PlainKernels(np)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_predicted_crossover_is_the_closed_form():
    # memory-bound to 16 rows, then the rows' arithmetic: t(B, k) = max(1, B k / 16)
    costs = {B: {1: max(1.0, B / 16), 5: max(1.0, 5 * B / 16)} for B in (1, 2, 4, 8, 16, 32)}
    p = crossover.predict(costs, gamma=4, alphas=[0.6, 0.8])
    for a in (0.6, 0.8):
        e = expected_tokens_per_call(a, 4)  # 2.31 and 3.36
        want = next(B for B in sorted(costs) if costs[B][5] / costs[B][1] >= e)
        assert p["stops_paying_at"][str(a)] == want
        row = p["rows"][0]  # batch 1: a 5-token call costs one step, E tokens each
        assert row["speculative"][str(a)] / row["plain"] == pytest.approx(e)
    assert p["stops_paying_at"] == {"0.6": 8, "0.8": 16}
    drafting = crossover.predict(costs, gamma=4, alphas=[0.8], draft_cost=0.25)
    assert drafting["rows"][0]["speculative"]["0.8"] == pytest.approx(3.36 / 2, abs=0.01)
    report = {"settings": {"model": "m", "dtype": "float16", "gpu": "g", "context": 64,
                           "repeats": 20}, "predicted": p}
    text = crossover.format_predicted(report)
    assert "PREDICTED" in text and "alpha 0.8: speculation stops paying at batch 16" in text


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="CuPy/NVIDIA GPU not available")
def test_the_tensor_core_product_past_16_rows_and_a_graphed_batch_call():
    import cupy as cp

    from minispec.batch_graphs import call_costs
    from minispec.cuda_graphs import FusedKernels

    k = FusedKernels(cp, np.float16)
    rs = np.random.default_rng(1)
    w = cp.asarray(rs.standard_normal((96, 64)).astype(np.float16) * 0.1).T  # [in, out] view
    for t in (1, 16, 17, 40, 64, 65, 130, 320):
        x = cp.asarray(rs.standard_normal((t, 64)).astype(np.float16))
        got = to_host(k.linear(x, w))
        want = to_host(x.astype(cp.float32) @ w.astype(cp.float32))
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)
        for r in (0, t // 2, t - 1):  # each row as it is alone, bit for bit
            assert np.array_equal(got[r], to_host(k.linear(x[r:r + 1], w))[0])
    for dtype, B, kk in ((np.float32, 3, 2), (np.float16, 5, 7)):
        model = random_model(tiny_config("llama", hidden_size=64, intermediate_size=128),
                             seed=0, scale=0.5, device="gpu", dtype=dtype)
        for got, want in _batch_against_one_sequence(model, FusedKernels(cp, dtype), B, kk):
            got, want = got.astype(np.float32), want.astype(np.float32)
            if dtype == np.float32:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            else:  # float16 rounding, differently ordered sums than cuBLAS's: to the row's scale
                assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    costs = call_costs(model, batch_sizes=(1, 4), ks=(1, 5), context=8, repeats=3)
    assert set(costs) == {1, 4} and all(t > 0 for ks in costs.values() for t in ks.values())
