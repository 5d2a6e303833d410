"""The GPU speed path (minispec/cuda_graphs.py) against the plain forward pass.

The shape-static step runs on NumPy too, so its logic (positions on the device, scattered cache
writes, attention over the whole cache under a mask) is checked on every machine; the fused
kernels and the graph capture need CuPy and a GPU."""

import numpy as np
import pytest
from conftest import FAMILIES, GPU, tiny_config

from minispec import cuda_graphs
from minispec.core.speculative import autoregressive_generate
from minispec.errors import MinispecError
from minispec.loader import random_model

needs_gpu = pytest.mark.skipif(not GPU, reason="CuPy/NVIDIA GPU not available")


def _static(m, kernels, tokens, cache):
    xp = m.xp
    if m._inv_freq is not None and cache.max_len > m._rope_len:
        m._grow_rope(cache.max_len)
    ids = xp.asarray(np.asarray(tokens, dtype=np.int64))
    positions = cache.length + xp.arange(len(tokens))
    h = cuda_graphs.static_hidden(m, kernels, ids, positions, cache)
    cache.length += len(tokens)
    return h


@pytest.mark.parametrize("family", FAMILIES)
def test_static_step_equals_the_plain_step(family):
    """Prefill, then steps of 1..5 tokens with rollbacks between them (stale keys past the cache
    length must stay masked): the same hidden states as Model.hidden_states, on NumPy."""
    m = random_model(tiny_config(family), seed=3, scale=0.3)
    kernels = cuda_graphs.PlainKernels(np)
    rng = np.random.default_rng(0)
    plain, static = m.new_cache(40), m.new_cache(40)
    prompt = rng.integers(0, 48, 6).tolist()
    m.hidden_states(prompt, plain)
    m.hidden_states(prompt, static)
    for t in (1, 3, 5, 2, 1, 4):
        toks = rng.integers(0, 48, t).tolist()
        a, b = m.hidden_states(toks, plain), _static(m, kernels, toks, static)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        keep = plain.length - int(rng.integers(0, t))  # reject some of the tokens just fed
        plain.rollback(keep)
        static.rollback(keep)


TREES = [([1], [-1, 0, 0, 1, 1, 2, 3]),  # (prefix length m, parents): Medusa's 2,2,1,1 shapes
         ([3], [-1, -1, 0, 0, 1, 4, 5, 5]),
         ([0], [-1, 0, -1, 2, 0]),
         ([2], [-1, 0, 1, 2])]  # a chain


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m, parents", [(m[0], p) for m, p in TREES])
def test_static_tree_step_equals_the_plain_tree_call(family, m, parents):
    """A tree call (minispec.tree.hidden_tree: m prefix tokens, then nodes at position n_ctx +
    depth in slot n_ctx + i, each seeing the context and its ancestors) through the static step,
    its shape given as positions and tree bits, on NumPy: the same hidden states and the same
    keys and values in the same slots as the plain call."""
    from minispec.tree import hidden_tree

    if tiny_config(family).sliding_window is not None:
        pytest.skip("a sliding window keeps trees on the plain path")
    mdl = random_model(tiny_config(family), seed=5, scale=0.3)
    rng = np.random.default_rng(3)
    plain, static = mdl.new_cache(40), mdl.new_cache(40)
    prompt = rng.integers(0, 48, 7).tolist()
    mdl.hidden_states(prompt, plain)
    mdl.hidden_states(prompt, static)
    prefix, tokens = rng.integers(0, 48, m).tolist(), rng.integers(0, 48, len(parents))
    a = hidden_tree(mdl, prefix, tokens, parents, plain)
    pos, bits = cuda_graphs.tree_inputs(mdl, parents, m, static)
    ids = np.concatenate([np.asarray(prefix, dtype=np.int64), tokens])
    slots = static.length + np.arange(len(ids))
    b = cuda_graphs.static_hidden(mdl, cuda_graphs.PlainKernels(np), ids, pos, static, slots,
                                  bits)
    static.length += m
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert static.length == plain.length
    end = plain.length + len(parents)
    np.testing.assert_allclose(static.k[:, :, :end], plain.k[:, :, :end], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(static.v[:, :, :end], plain.v[:, :, :end], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_head_equals_the_plain_head(family):
    m = random_model(tiny_config(family), seed=4, scale=0.3)
    h = np.random.default_rng(0).standard_normal((3, m.config.hidden_size)).astype(np.float32)
    out = cuda_graphs.static_head(m, cuda_graphs.PlainKernels(np), h)
    assert out.dtype == np.float32 and out.shape == (3, m.vocab_size)
    np.testing.assert_allclose(out, m.lm_head(h), rtol=1e-6, atol=1e-6)


def test_graphs_refuse_a_cpu_model():
    m = random_model(tiny_config(), seed=0)
    with pytest.raises(MinispecError, match="GPU"):
        cuda_graphs.enable(m)


def _close(a, b, tol):
    """|a - b| / |b| (Frobenius) under tol: float16 rounds the residual stream at ~1e-3."""
    a, b = (np.asarray(getattr(x, "get", lambda: x)(), dtype=np.float64) for x in (a, b))
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert err < tol, err


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_kernels_equal_the_plain_pieces(family, dtype):
    """The static step with the fused kernels against the same step with model.py's pieces, on
    a warm cache, 1..16 tokens at a time (the few-rows product's row counts)."""
    import cupy as cp

    m = random_model(tiny_config(family), seed=1, scale=0.3, device="gpu", dtype=dtype)
    plain, fused = cuda_graphs.PlainKernels(cp), cuda_graphs.FusedKernels(cp, dtype)
    tol = 1e-5 if dtype == "float32" else 5e-3
    c1, c2 = m.new_cache(48), m.new_cache(48)
    prompt = list(range(3, 9))
    m.hidden_states(prompt, c1)
    m.hidden_states(prompt, c2)
    for t in (1, 4, 9, 16):
        toks = [(7 * i + t) % 48 for i in range(t)]
        _close(_static(m, fused, toks, c1), _static(m, plain, toks, c2), tol)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("d_in", [64, 100])  # 16-byte loads, and the scalar loop
def test_few_rows_products_do_not_depend_on_the_other_rows(dtype, d_in):
    """Every row of a call is the same bits as that row's one-row call, whatever the number of
    rows (a verify call's rows equal one-token steps) and however many outputs a warp computes
    (37 outputs: the last warp has fewer than the others), and close to cuBLAS's product."""
    import cupy as cp

    k = cuda_graphs.FusedKernels(cp, dtype)
    rng = np.random.default_rng(0)
    w = cp.asarray(rng.standard_normal((37, d_in)), dtype).T  # [d_in, 37], one output per row
    w2 = cp.asarray(rng.standard_normal((37, d_in)), dtype).T
    x = cp.asarray(rng.standard_normal((16, d_in)), dtype)
    one = [k.linear(x[r:r + 1], w)[0] for r in range(16)]
    one_swiglu = [k._swiglu(x[r:r + 1], w, w2)[0] for r in range(16)]
    for t in range(1, 17):
        y, y_swiglu = k.linear(x[:t], w), k._swiglu(x[:t], w, w2)
        for r in range(t):
            cp.testing.assert_array_equal(y[r], one[r])
            cp.testing.assert_array_equal(y_swiglu[r], one_swiglu[r])
    _close(cp.stack(one), x @ w, 1e-5 if dtype == "float32" else 2e-3)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_graph_replays_equal_the_plain_path(family):
    """Steps of 1..5 tokens with rollbacks, replayed from graphs, against Model.hidden_states."""
    m = random_model(tiny_config(family), seed=3, scale=0.3, device="gpu")
    rng = np.random.default_rng(1)
    plain, fast = m.new_cache(40), m.new_cache(40)
    prompt = rng.integers(0, 48, 6).tolist()
    m.hidden_states(prompt, plain)
    m.hidden_states(prompt, fast)
    graphs = cuda_graphs.StepGraphs(m)
    for t in (1, 3, 5, 1, 3, 1, 1, 5):
        toks = rng.integers(0, 48, t).tolist()
        a, b = m.hidden_states(toks, plain), graphs.hidden_states(toks, fast)
        assert fast.length == plain.length
        _close(b, a, 1e-5)
        keep = plain.length - int(rng.integers(0, t))
        plain.rollback(keep)
        fast.rollback(keep)
    assert graphs.captures == 3  # one per (cache, T); the other calls were replays


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_head_replays_equal_the_plain_head(family, dtype):
    """Model.lm_head's graph (final norm, the few-rows product over the vocabulary, float32 out)
    against the plain head, for 1..16 rows; one capture per row count."""
    import cupy as cp

    m = random_model(tiny_config(family), seed=2, scale=0.3, device="gpu", dtype=dtype)
    graphs = cuda_graphs.StepGraphs(m)
    rng = np.random.default_rng(2)
    for t in (1, 5, 1, 16, 5):
        h = cp.asarray(rng.standard_normal((t, m.config.hidden_size)), dtype)
        out = graphs.lm_head(h)
        assert out.dtype == np.float32 and out.shape == (t, m.vocab_size)
        _close(out, m.lm_head(h), 1e-5 if dtype == "float32" else 2e-3)
    assert graphs.captures == 3
    assert graphs.lm_head(cp.zeros((17, m.config.hidden_size), dtype)) is None  # past max_tokens
    assert cuda_graphs.StepGraphs(m, head=False).lm_head(h) is None


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mistral"])
def test_tree_replays_equal_the_plain_tree_call(family):
    """Tree calls replayed from graphs against minispec.tree.hidden_tree on the plain path: the
    hidden states, then (after keeping one path) the next step's; trees of the same row count
    but other shapes replay the same graph."""
    import cupy as cp

    from minispec.tree import hidden_tree, keep_path

    mdl = random_model(tiny_config(family), seed=5, scale=0.3, device="gpu")
    rng = np.random.default_rng(4)
    plain, fast = mdl.new_cache(64), mdl.new_cache(64)
    prompt = rng.integers(0, 48, 6).tolist()
    mdl.hidden_states(prompt, plain)
    mdl.hidden_states(prompt, fast)
    graphs = cuda_graphs.StepGraphs(mdl)
    shapes = [[-1, 0, 0, 1, 1, 2, 3], [-1, -1, 0, 1, 2, 2, 5], [-1, 0, 1, 2]]
    for m, parents in [(1, shapes[0]), (1, shapes[1]), (2, shapes[2]), (1, shapes[0])]:
        prefix, tokens = rng.integers(0, 48, m).tolist(), rng.integers(0, 48, len(parents))
        a = hidden_tree(mdl, prefix, tokens, parents, plain)
        b = graphs.hidden_tree(np.concatenate([prefix, tokens]).astype(np.int64), parents, m,
                               fast)
        assert fast.length == plain.length
        _close(b, a, 1e-5)
        path = [0, 1] if parents[1] == 0 else [1]
        keep_path(plain, path)
        keep_path(fast, path)
        toks = rng.integers(0, 48, 2).tolist()
        _close(graphs.hidden_states(toks, fast), mdl.hidden_states(toks, plain), 1e-5)
    _close(cp.asarray(fast.k[:, :, :fast.length]), plain.k[:, :, :plain.length], 1e-5)
    assert graphs.captures == 3  # trees of 8 rows, of 6 rows, the chain step of 2


@needs_gpu
@pytest.mark.gpu
def test_tree_drafters_with_graphs_match_autoregressive():
    """Greedy tree drafting (the draft model's tree, Medusa, EAGLE, EAGLE-2) with the target's
    tree calls replayed from graphs == autoregressive decoding, and the graphs were used."""
    import minispec
    from minispec.drafters.tree_model import TreeModelDrafter

    target = random_model(tiny_config(), seed=0, scale=0.5, device="gpu")
    draft = random_model(tiny_config(n_layers=1), seed=0, scale=0.4, device="gpu")
    drafters = [TreeModelDrafter(target, draft, (2, 2, 1)),
                minispec.drafters.random_medusa(target, 3, seed=1, scale=0.3, shape=(2, 1, 1)),
                minispec.drafters.random_eagle(target, seed=1, shape=(2, 2, 1)),
                minispec.drafters.random_eagle(target, seed=1, shape=(3, 2, 2), dynamic=(2, 6))]
    prompts = ([3, 17, 5], [9] * 11)
    base = [autoregressive_generate(target, p, max_new_tokens=20, temperature=0).tokens
            for p in prompts]
    graphs = cuda_graphs.enable(target)
    try:
        for drafter in drafters:
            for p, b in zip(prompts, base):
                out = minispec.speculative_generate(target, drafter, p, gamma=3,
                                                    max_new_tokens=20, temperature=0.0)
                assert out.tokens == b, type(drafter).__name__
    finally:
        cuda_graphs.disable(target)
    assert any(k[-1] == "tree" for k in graphs.graphs)


@needs_gpu
@pytest.mark.gpu
def test_greedy_generation_with_graphs_is_unchanged():
    from minispec.loader import load
    from minispec.shipped import shipped_dir

    target = load(shipped_dir() / "target", device="gpu")
    prompt = target.tokenizer.encode("def fibonacci(n):")
    plain = autoregressive_generate(target, prompt, max_new_tokens=40, temperature=0).tokens
    cuda_graphs.enable(target)
    try:
        fast = autoregressive_generate(target, prompt, max_new_tokens=40, temperature=0).tokens
    finally:
        cuda_graphs.disable(target)
    assert fast == plain


@pytest.mark.skipif(GPU, reason="checks the error a machine without a GPU gives")
def test_the_gpu_pipeline_says_why_it_cannot_run_here():
    from minispec.generators import speculative_gpu
    from minispec.shipped import shipped_dir

    with pytest.raises(MinispecError, match="gpu"):
        speculative_gpu(shipped_dir() / "target", shipped_dir() / "draft")
