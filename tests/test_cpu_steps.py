"""The CPU speed path (minispec/cpu_steps.py) against model.py's plain forward pass.

Each numba loop computes what the NumPy pieces compute, in another order: the hidden states
agree to float32 rounding, and within the fast path a row's arithmetic never depends on the
rows beside it, so a verify call gives each token the logits its own one-token step gives it."""

import copy

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config

from minispec import cpu_steps
from minispec.core.sampling import Sampling, sample, warp
from minispec.core.speculative import Request, generate
from minispec.drafters import FusedModelDrafter, ModelDrafter, NoDrafter, make_drafter
from minispec.errors import MinispecError
from minispec.loader import load, random_model
from minispec.tree import hidden_tree


def _close(b, a):
    """Equal to float32 rounding, measured against the largest value: hidden states run to ~10
    or ~100, and the numba loops sum in another order than BLAS (whose order is the CPU's)."""
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * max(1.0, float(np.abs(a).max())))


def _warm_pair(family, seed, rng, prompt_len, **config):
    """The same random model twice, the plain one and one on the CPU step, each with a cache
    holding the same random prompt of prompt_len tokens (none for 0); `config` changes the
    tiny config."""
    plain = random_model(tiny_config(family, **config), seed=seed, scale=0.3)
    fast = random_model(tiny_config(family, **config), seed=seed, scale=0.3)
    cpu_steps.enable(fast)
    caches = plain.new_cache(48), fast.new_cache(48)
    if prompt_len:
        prompt = rng.integers(0, 48, prompt_len).tolist()
        plain.hidden_states(prompt, caches[0])
        fast.hidden_states(prompt, caches[1])
    return plain, fast, caches


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cpu_step_equals_the_plain_step(family):
    """Prefill, then calls of 1..5 tokens with rollbacks between them (stale keys past the cache
    length must stay unseen; mistral's window of 6 hides the oldest): the same hidden states,
    logits and cached keys as Model.hidden_states."""
    rng = np.random.default_rng(0)
    plain, fast, (a_cache, b_cache) = _warm_pair(family, 3, rng, 6)
    for t in (1, 3, 5, 2, 1, 4, 1, 1, 3):
        toks = rng.integers(0, 48, t).tolist()
        a, b = plain.hidden_states(toks, a_cache), fast.hidden_states(toks, b_cache)
        _close(b, a)
        _close(fast.lm_head(b), plain.lm_head(a))
        keep = a_cache.length - int(rng.integers(0, t))  # reject some of the tokens just fed
        a_cache.rollback(keep)
        b_cache.rollback(keep)
    n = a_cache.length
    _close(b_cache.k[:, :, :n], a_cache.k[:, :, :n])
    _close(b_cache.v[:, :, :n], a_cache.v[:, :, :n])


def _assert_a_call_is_its_steps(model, cache, toks):
    """One call of `toks` gives each row the logits its own one-token step gives it, bit for
    bit; the cache is left as it was."""
    n = cache.length
    together = model.forward(toks, cache)
    cache.rollback(n)
    alone = np.concatenate([model.forward([t], cache) for t in toks])
    cache.rollback(n)
    assert np.array_equal(together, alone)


HEAD_64 = {"hidden_size": 128, "n_heads": 2, "n_kv_heads": 1}  # head_dim 64: one 64-lane value


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_heads_of_64_take_the_lane_attention_and_equal_the_plain_step(family):
    """A head of 64 numbers is attended to as one 64-lane value (kernels._attention's other
    branch): calls of 1..5 tokens after a prompt longer than mistral's window, then a tree
    (llama), give the plain path's hidden states and cached keys; each row's logits are its
    own one-token step's, bit for bit. These hidden states run to ~100."""

    rng = np.random.default_rng(7)
    plain, fast, (a_cache, b_cache) = _warm_pair(family, 8, rng, 9, **HEAD_64)
    assert fast.config.head_dim == 64
    for t in (1, 5, 3, 1):
        toks = rng.integers(0, 48, t).tolist()
        a, b = plain.hidden_states(toks, a_cache), fast.hidden_states(toks, b_cache)
        _close(b, a)
    n = a_cache.length
    _close(b_cache.k[:, :, :n], a_cache.k[:, :, :n])
    _assert_a_call_is_its_steps(fast, b_cache, rng.integers(0, 48, 4).tolist())
    if family == "llama":
        b_cache.rollback(n)
        a_cache.rollback(n)
        tokens, parents = rng.integers(0, 48, 5), [-1, 0, 0, 1, 1]
        _close(hidden_tree(fast, [3], tokens, parents, b_cache),
               hidden_tree(plain, [3], tokens, parents, a_cache))


@pytest.mark.parametrize("family, config", [
    ("llama", {"hidden_size": 384, "n_heads": 6, "n_kv_heads": 1}),  # 6 heads a kv head: 4 + 2
    ("llama", {"hidden_size": 192, "n_heads": 3, "n_kv_heads": 1}),  # SmolLM2's 3
    ("mistral", {**HEAD_64, "sliding_window": 37})])
def test_the_lane_attention_over_long_contexts_equals_the_plain_step(family, config):
    """Contexts of 38..60 keys, so that the scores come 16 keys at a time and then one by one
    (kernels._attend_lanes; a window of 37 starting past key 0): the plain path's hidden states
    and keys, and a call's rows bit for bit its one-token steps."""
    rng = np.random.default_rng(11)
    config = {"max_position_embeddings": 80, **config}
    plain = random_model(tiny_config(family, **config), seed=2, scale=0.2)
    fast = random_model(tiny_config(family, **config), seed=2, scale=0.2)
    cpu_steps.enable(fast)
    a_cache, b_cache = plain.new_cache(72), fast.new_cache(72)
    prompt = rng.integers(0, 48, 38).tolist()
    plain.hidden_states(prompt, a_cache)
    fast.hidden_states(prompt, b_cache)
    for t in (1, 5, 3, 1, 6, 2):
        toks = rng.integers(0, 48, t).tolist()
        _close(fast.hidden_states(toks, b_cache), plain.hidden_states(toks, a_cache))
    n = a_cache.length
    _close(b_cache.v[:, :, :n], a_cache.v[:, :, :n])
    _assert_a_call_is_its_steps(fast, b_cache, rng.integers(0, 48, 5).tolist())


def test_the_lane_attentions_scores_are_dot_products_and_its_exp_its_reference():
    """kernels._scores16 gives each of 16 keys the score _dot gives it alone, bit for bit;
    kernels._exp16 is kernels.exp_reference bit for bit (NaN, -inf and the range's edges
    included), within one ulp of exp on [-87, 0], and 0 below EXP_LOW. Both compiled as
    _attend_lanes is, without fastmath."""
    numba = pytest.importorskip("numba")
    from minispec import kernels

    kernels.compiled()

    @numba.njit(fastmath=False)
    def scores(q, keys, j, scale, out):
        v = kernels._load(q, 0)
        kernels._store16(out, 0, 0, kernels._scores16(v, keys, j, scale))
        for m in range(16):
            out[1, m] = kernels._dot(v, kernels._load(keys, j + m)) * scale

    @numba.njit(fastmath=False)
    def exps(x, best, out):
        for j in range(0, x.shape[1], 16):
            kernels._store16(out, 0, j, kernels._exp16(kernels._load16(x, 0, j), best))

    rng = np.random.default_rng(4)
    for _ in range(50):
        q = (rng.standard_normal((1, 64)) * rng.uniform(0.1, 10)).astype(np.float32)
        keys = (rng.standard_normal((40, 64)) * rng.uniform(0.1, 10)).astype(np.float32)
        out = np.zeros((2, 16), np.float32)
        scores(q, keys, int(rng.integers(0, 25)), np.float32(0.125), out)
        assert np.array_equal(out[0], out[1])
    x = np.concatenate([rng.uniform(-100, 0, 4000), np.linspace(-87, 0, 1000),
                        [-np.inf, np.nan, 0, kernels.EXP_LOW, -87.34, -1e-30, -103, 1e-3],
                        np.zeros(8)]).astype(np.float32)[None]
    got = np.empty_like(x)
    exps(x, np.float32(0.5), got)
    assert np.array_equal(got, kernels.exp_reference(x, 0.5), equal_nan=True)
    y = (x - np.float32(0.5)).astype(np.float64)  # the difference _exp16 takes the exp of
    inside = (y >= -87) & (y <= 0)
    true = np.exp(y[inside])
    assert np.all(np.abs(got[inside] - true) <= np.spacing(true.astype(np.float32)))
    assert not got[np.nan_to_num(y, nan=0) < kernels.EXP_LOW].any()
    assert np.isnan(got[np.isnan(y)]).all()


TREES = [(1, [-1, 0, 0, 1, 1, 2, 3]),  # (prefix length, parents): Medusa's 2,2,1,1 shape
         (3, [-1, -1, 0, 0, 1, 4, 5, 5]),
         (0, [-1, 0, -1, 2, 0])]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mistral"])
@pytest.mark.parametrize("m, parents", TREES)
def test_a_tree_call_equals_the_plain_tree_call(family, m, parents):
    """minispec.tree.hidden_tree through the CPU step (each node sees the context and its
    ancestors, given as tree bits): the plain call's hidden states and cached keys."""
    rng = np.random.default_rng(3)
    plain, fast, (a_cache, b_cache) = _warm_pair(family, 5, rng, 7)
    prefix, tokens = rng.integers(0, 48, m).tolist(), rng.integers(0, 48, len(parents))
    a = hidden_tree(plain, prefix, tokens, parents, a_cache)
    b = hidden_tree(fast, prefix, tokens, parents, b_cache)
    _close(b, a)
    assert b_cache.length == a_cache.length
    end = a_cache.length + len(parents)
    _close(b_cache.k[:, :, :end], a_cache.k[:, :, :end])


def _count_calls(kernels, *names):
    """Make the numba loops `names` of a NumbaKernels record each call (by name, in order) in
    the list returned; the caller puts kernels._k back."""
    from types import SimpleNamespace

    loops, calls = kernels._k, []

    def counted(name):
        def call(*args):
            calls.append(name)
            return getattr(loops, name)(*args)
        return call

    kernels._k = SimpleNamespace(**{**vars(loops), **{n: counted(n) for n in names}})
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_in_one_call_equals_a_block_a_call_and_the_pieces(family):
    """kernels.layers (every layer of a Llama-shaped model in one numba call), kernels.block_front
    (one block up to its SiLU in one call, a call a layer) and the pieces one by one give the
    same rows and cached keys, bit for bit, for calls of 1..5 tokens and a tree's; models whose
    layers it cannot do (GPT-2's LayerNorm and GELU, Qwen2's biases) take the pieces."""
    from minispec.cuda_graphs import PlainKernels

    rng = np.random.default_rng(4)
    _, fast, _ = _warm_pair(family, 6, rng, 0)
    steps = fast.fast_steps
    one_call = steps.kernels
    layer = fast.weights["layers"][0]
    llama_shaped = family in ("llama", "mistral")
    assert (one_call._block_weights(layer, (fast._cos, fast._sin)) is not None) == llama_shaped
    assert (steps._layer_lists() is not None) == llama_shaped
    lists = steps._lists

    class Pieces(cpu_steps.NumbaKernels):
        def block(self, *args, **kwargs):
            return PlainKernels.block(self, *args, **kwargs)

    ways = [(one_call, lists), (one_call, None), (Pieces(), None)]  # _lists None: a call a layer
    caches = [fast.new_cache(48) for _ in ways]
    prompt = rng.integers(0, 48, 7).tolist()
    for cache in caches:
        fast.hidden_states(prompt, cache)

    def each_way(call):
        got = []
        for (kernels, lists), cache in zip(ways, caches):
            steps.kernels, steps._lists = kernels, lists
            got.append(call(cache))
        steps.kernels, steps._lists = ways[0]
        return got

    for t in (1, 3, 5, 1, 2):
        toks = rng.integers(0, 48, t).tolist()
        first, *others = each_way(lambda cache: fast.hidden_states(toks, cache))
        assert all(np.array_equal(first, other) for other in others)
    if family != "mistral":  # trees: no sliding window
        tokens, parents = rng.integers(0, 48, 5), [-1, 0, 0, 1, 1]
        first, *others = each_way(lambda cache: hidden_tree(fast, [3], tokens, parents, cache))
        assert all(np.array_equal(first, other) for other in others)
    n = caches[0].length + 5
    for other in caches[1:]:
        assert np.array_equal(caches[0].k[:, :, :n], other.k[:, :, :n])
        assert np.array_equal(caches[0].v[:, :, :n], other.v[:, :, :n])


def test_with_the_kernel_off_the_layers_go_piece_by_piece():
    """backend.use_kernel(False) sends every product to NumPy, the layers' too: the one-call
    layers and blocks (whose products are the kernel's) are not used then; with it on, a step is
    one call of kernels.layers, or one of block_front a layer where the layers' lists are not
    made."""
    from minispec.backend import use_kernel

    _, fast, (_, cache) = _warm_pair("llama", 6, np.random.default_rng(5), 4)
    steps = fast.fast_steps
    kernels, loops = steps.kernels, steps.kernels._k
    calls = _count_calls(kernels, "block_front", "layers")
    try:
        with use_kernel(False):
            fast.hidden_states([1, 2], cache)
        assert calls == []
        fast.hidden_states([3], cache)
        assert calls == ["layers"]
        calls.clear()
        steps._lists = None
        fast.hidden_states([4], cache)
        assert calls == ["block_front"] * fast.n_layers
    finally:
        kernels._k, steps._lists = loops, False


@pytest.fixture(scope="module")
def shipped_fast():
    """The shipped pair on the CPU step (the target's matrices bfloat16 as stored)."""
    target, draft = load("shipped:target", device="cpu"), load("shipped:draft", device="cpu")
    cpu_steps.enable_where_supported(target, draft, None)
    assert target.fast_steps is not None and draft.fast_steps is not None
    return target, draft


def test_a_verify_call_gives_each_token_its_one_token_logits_bit_for_bit(shipped_fast):
    """k tokens in one call, or one at a time, or as a chain-shaped tree: the same logits, bit
    for bit, for every k the loop uses (the rows never meet)."""
    target, _ = shipped_fast
    prompt, last = list(range(10, 49)), 49  # the prefill (plain), then calls of a few tokens
    toks = [5, 77, 1023, 9, 300, 2, 41, 8]

    def warm():
        cache = target.new_cache(128)
        target.forward(prompt, cache)
        return cache

    steps = warm()
    one = np.concatenate([target.forward([t], steps) for t in [last] + toks])  # [9, V]
    for k in (1, 4, 8):
        assert np.array_equal(target.forward([last] + toks[:k], warm()), one[:k + 1])
    h = hidden_tree(target, [last], toks[:5], [-1, 0, 1, 2, 3], warm())
    assert np.array_equal(target.lm_head(h), one[:6])


def test_greedy_speculative_equals_autoregressive_on_the_cpu_step(shipped_fast):
    """The loop's promise on the fast path: the draft model's chain and autoregressive decoding
    give the same tokens; and the plain path's logits agree with the fast path's."""
    target, draft = shipped_fast
    sampling, request = Sampling(0.0), Request(40, None, seed=0)
    for prompt in ([3, 14, 15, 92, 65], list(range(100, 160, 3))):
        ar = generate(target, NoDrafter(target), prompt, sampling, request, gamma=0)
        spec = generate(target, ModelDrafter(target, draft), prompt, sampling, request, gamma=4)
        assert spec.tokens == ar.tokens
    plain = load("shipped:target", device="cpu")
    c1, c2 = plain.new_cache(64), target.new_cache(64)
    plain.forward(list(range(20)), c1)
    target.forward(list(range(20)), c2)
    np.testing.assert_allclose(target.forward([7, 8, 9], c2), plain.forward([7, 8, 9], c1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family, config", [(f, {}) for f in FAMILIES] + [
    ("llama", HEAD_64), ("mistral", HEAD_64)])
def test_a_batch_gives_each_sequence_its_own_step_bit_for_bit(family, config):
    """B sequences at their own positions, 1..5 tokens each, in one batched call on the CPU
    step: each sequence's rows and cached keys are those of its own call, bit for bit, and
    agree with model.py's plain batched call, every family (mistral's window of 6 hides the
    oldest keys), heads of 64 too. A model of Llama-shaped blocks takes one call for the whole
    batch (kernels.batch_layers), or one a layer (kernels.batch_front) where the layers' lists
    are not made: both ways are checked."""
    from minispec.batch_forward import batch_hidden

    rng = np.random.default_rng(2)
    plain, fast, _ = _warm_pair(family, 5, rng, 0, **config)
    steps = fast.fast_steps
    kernels, loops = steps.kernels, steps.kernels._k
    calls = _count_calls(kernels, "batch_front", "batch_layers")
    prompts = [rng.integers(0, 48, n).tolist() for n in (3, 9, 6, 1)]
    batched, alone, ref = ([m.new_cache(48) for _ in prompts] for m in (fast, fast, plain))
    for model, caches in ((fast, batched), (fast, alone), (plain, ref)):
        for p, c in zip(prompts, caches):
            model.hidden_states(p, c)
    lists = steps._layer_lists()
    for i, sizes in enumerate(((1, 1, 1, 1), (5, 1, 3, 2), (1, 4, 1, 1))):
        toks = [rng.integers(0, 48, t).tolist() for t in sizes]
        steps._lists = None if i == 1 else lists  # the second call a layer at a time
        got = batch_hidden(fast, toks, batched)
        steps._lists = lists
        want = [fast.hidden_states(t, c) for t, c in zip(toks, alone)]
        for g, w, r in zip(got, want, batch_hidden(plain, toks, ref)):
            assert np.array_equal(g, w)
            _close(g, r)
    kernels._k = loops
    for a, b in zip(batched, alone):
        n = b.length
        assert a.length == n and np.array_equal(a.k[:, :, :n], b.k[:, :, :n])
    llama_shaped = family in ("llama", "mistral")
    assert calls == (["batch_layers", *["batch_front"] * fast.n_layers, "batch_layers"]
                     if llama_shaped else [])


@pytest.mark.parametrize("family, config", [("llama", {}), ("llama", HEAD_64),
                                            ("llama", {"n_layers": 3}), ("qwen2", {}),
                                            ("mistral", {}), ("gpt2", {})])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_draft_chain_is_the_steps_one_by_one(family, config, temperature):
    """draft_chain (one numba call for a draft model's g steps) against the plain path's calls:
    2 tokens fed, then each draft fed back, the last one not: the same logits and cached keys
    and values to float32 rounding, the cache as long; greedy, each draft the argmax; sampled,
    q the loop's warp of the step's logits (to their rounding) and each draft what
    sampling.sample draws from it with the same Generator's numbers; the logits are the CPU
    step's own, bit for bit (the same pieces and SiLU). Biases (qwen2), a window (mistral) and
    LayerNorm (gpt2) are not served: None, the cache untouched, nothing drawn."""
    rng = np.random.default_rng(5)
    plain, fast, (a_cache, b_cache) = _warm_pair(family, 4, rng, 7, **config)
    own_cache = copy.deepcopy(b_cache)
    feed, g, seed = [11, 30], 4, 9
    ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
    done = fast.fast_steps.draft_chain(feed, b_cache, g, 48, temperature, ours)
    if family != "llama":
        assert done is None and b_cache.length == 7
        assert ours.random() == theirs.random()  # no number taken
        return
    tokens, logits, q = done
    assert tokens.shape == (g,) and logits.shape == (g, 48)
    assert (q is None) == (temperature == 0)
    for i in range(g):
        fed = feed if i == 0 else [int(tokens[i - 1])]
        step = plain.forward(fed, a_cache)[-1]
        _close(logits[i], step)
        assert np.array_equal(logits[i], fast.forward(fed, own_cache)[-1])
        if temperature == 0:
            assert tokens[i] == np.argmax(step) == np.argmax(logits[i])
        else:
            want = warp(step, temperature)
            np.testing.assert_allclose(q[i], want, rtol=1e-4, atol=1e-9)
            assert q[i].sum() == pytest.approx(1.0, abs=1e-12)
            assert tokens[i] == sample(want, theirs)
    assert b_cache.length == a_cache.length == 7 + len(feed) + g - 1
    n = a_cache.length
    _close(b_cache.k[:, :, :n], a_cache.k[:, :, :n])
    _close(b_cache.v[:, :, :n], a_cache.v[:, :, :n])


def test_the_fused_drafter_drafts_what_the_core_loop_drafts(shipped_fast, monkeypatch):
    """make_drafter("model") on the CPU step: greedy, or sampled with temperature alone, its
    chains come from draft_chain, with the core ModelDrafter's drafts round by round, its output
    and (greedy) autoregressive decoding's; with top-k it is the core's loop (draft_chain never
    called), the same seeded output and rounds."""
    target, draft = shipped_fast
    fused = make_drafter("model", target, draft_model=draft)
    assert type(fused) is FusedModelDrafter
    served = []
    chain = draft.fast_steps.draft_chain
    monkeypatch.setattr(draft.fast_steps, "draft_chain",
                        lambda *a: served.append(chain(*a)) or served[-1])
    for sampling in (Sampling(0.0), Sampling(1.0), Sampling(0.6), Sampling(1.0, top_k=20)):
        request = Request(40, None, seed=3)
        for prompt in ([3, 14, 15, 92, 65], list(range(100, 160, 3))):
            core = generate(target, ModelDrafter(target, draft), prompt, sampling, request,
                            gamma=4)
            ours = generate(target, fused, prompt, sampling, request, gamma=4)
            assert ours.tokens == core.tokens
            assert ours.stats.rounds == core.stats.rounds  # drafts, kept, tokens: all equal
            assert ours.stats.draft_calls == core.stats.draft_calls
            if sampling.greedy:
                ar = generate(target, NoDrafter(target), prompt, sampling, request, gamma=0)
                assert ours.tokens == ar.tokens
        assert bool(served) == (sampling.top_k == 0)
        assert all(done is not None for done in served)
        served.clear()


def test_the_fused_drafter_with_a_draft_vocabulary_drafts_what_the_tuned_loop_drafts(
        shipped_fast, monkeypatch):
    """make_drafter("model", draft_vocab=ids) on the CPU step: the chain computes only those
    rows of the LM head (q = 0 elsewhere) and drafts, round by round, what TunedModelDrafter's
    loop with the same cut drafts, greedy and sampled (temperature alone), seeded; with top-k
    it is that loop (draft_chain never called)."""
    from minispec.drafters import TunedModelDrafter

    target, draft = shipped_fast
    cut = np.unique(np.r_[np.arange(0, 4096, 3), np.arange(1000)])  # most of the ids said
    fused = make_drafter("model", target, draft_model=draft, draft_vocab=cut)
    assert type(fused) is FusedModelDrafter
    served, chain = [], draft.fast_steps.draft_chain
    monkeypatch.setattr(draft.fast_steps, "draft_chain",
                        lambda *a: served.append(chain(*a)) or served[-1])
    outside = np.setdiff1d(np.arange(4096), cut)
    for sampling in (Sampling(0.0), Sampling(1.0), Sampling(0.6), Sampling(1.0, top_k=20)):
        request = Request(40, None, seed=3)
        for prompt in ([3, 14, 15, 92, 65], list(range(100, 160, 3))):
            tuned = generate(target, TunedModelDrafter(target, draft, cut), prompt, sampling,
                             request, gamma=4)
            ours = generate(target, fused, prompt, sampling, request, gamma=4)
            assert ours.tokens == tuned.tokens
            assert ours.stats.rounds == tuned.stats.rounds
            assert not np.isin([t for r in ours.stats.rounds for t in r.drafted], outside).any()
        assert bool(served) == (sampling.top_k == 0)
        for done in served:  # q 0 and logits -inf outside the cut
            assert np.isneginf(done[1][:, outside]).all()
            assert done[2] is None or not done[2][:, outside].any()
        served.clear()


def test_a_draft_vocabulary_with_ids_past_the_sampled_ones_is_left_to_the_loop():
    """draft_chain serves a cut only where q has a column for each of its ids (v: the ids the
    drafter samples); otherwise None, nothing drawn, nothing written (FusedModelDrafter then
    drafts with the loop)."""
    from minispec.drafters.vocab import DraftVocab

    draft = random_model(tiny_config("llama", n_layers=1), seed=2, scale=0.3)
    cpu_steps.enable(draft)
    cache, rng = draft.new_cache(48), np.random.default_rng(0)
    inside, past = DraftVocab(draft, np.arange(0, 40, 2)), DraftVocab(draft, np.arange(0, 48, 2))
    assert draft.fast_steps.draft_chain([3, 5], cache, 3, 40, 1.0, rng, past) is None
    assert cache.length == 0 and rng.random() == np.random.default_rng(0).random()
    tokens, logits, q = draft.fast_steps.draft_chain([3, 5], cache, 3, 40, 1.0, rng, inside)
    assert q.shape == (3, 40) and (tokens % 2 == 0).all() and not q[:, 1::2].any()
    np.testing.assert_allclose(q.sum(axis=1), 1.0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_fused_drafter_with_a_smaller_vocabulary_up_to_the_context_limit(temperature,
                                                                             monkeypatch):
    """A draft model of 40 ids for a target of 48 (no tokenizers: q is 0 past the draft's ids)
    and generations that run into the 64-position context (the last rounds draft less): the
    fused chain gives the core loop's rounds and output, seeded."""
    target = random_model(tiny_config("llama"), seed=1, scale=0.3)
    draft = random_model(tiny_config("llama", vocab_size=40, n_layers=1), seed=2, scale=0.3)
    cpu_steps.enable_where_supported(target, draft)
    served, chain = [], draft.fast_steps.draft_chain
    monkeypatch.setattr(draft.fast_steps, "draft_chain",
                        lambda *a: served.append(chain(*a)) or served[-1])
    sampling = Sampling(temperature)
    for prompt, n in (([5, 9, 3], 30), (list(range(1, 40)), 40)):
        request = Request(n, None, seed=4)
        core = generate(target, ModelDrafter(target, draft), prompt, sampling, request, gamma=4)
        fused = generate(target, FusedModelDrafter(target, draft), prompt, sampling, request,
                         gamma=4)
        assert fused.tokens == core.tokens
        assert fused.stats.rounds == core.stats.rounds
    assert len(prompt) + len(fused.tokens) == 64  # the context's end
    # every round but the 39-token prompt's first (a prefill: the core's loop) took the chain
    assert sum(done is None for done in served) == 1 and len(served) >= 8


def test_a_small_batch_drafts_one_chain_each_with_the_batched_steps_rounds(shipped_fast,
                                                                           monkeypatch):
    """generate_batch with a draft model on the CPU step: while a batch has up to CHAINS_UP_TO
    live sequences each chain is drafted in one call (draft_chain), with more one batched call
    per draft step; greedy, both give each prompt its autoregressive output, and sampled, a
    sequence's rounds (drafts, kept, tokens) are the same alone as in a batch of three."""
    from minispec.batch import CHAINS_UP_TO, BatchDecoder, generate_batch
    from minispec.drafters import draft_model

    def finish(decoder):
        done = []
        while decoder.live:
            done += decoder.step()
        return done[0][1]

    target, draft = shipped_fast
    served, chain = [], draft.fast_steps.draft_chain
    monkeypatch.setattr(draft.fast_steps, "draft_chain",
                        lambda *a: served.append(chain(*a)) or served[-1])
    batched, steps = [], draft_model.propose_batch
    monkeypatch.setattr(draft_model, "propose_batch",
                        lambda ds, *a: batched.append(len(ds)) or steps(ds, *a))
    prompts = [[3, 14, 15, 92, 65], list(range(100, 160, 3)), [7, 7, 8, 9, 1000, 2]]
    assert CHAINS_UP_TO < len(prompts)
    for temperature in (0.0, 1.0):
        kw = {"gamma": 4, "max_new_tokens": 24, "temperature": temperature, "seed": 5}
        alone = []
        for i, p in enumerate(prompts):  # each alone, with the stream it has in the batch
            decoder = BatchDecoder(target, draft, Sampling(temperature), gamma=4)
            decoder.add(p, Request(24), np.random.default_rng([5, i]))
            alone.append(finish(decoder))
        assert served and all(done is not None for done in served) and not batched
        crowd = generate_batch(target, draft, prompts, **kw)
        assert batched and min(batched) > CHAINS_UP_TO  # three live: batched steps
        batched.clear()
        for a, c in zip(alone, crowd):
            assert a.tokens == c.tokens and a.stats.rounds == c.stats.rounds
        if temperature == 0:
            for p, a in zip(prompts, alone):
                ar = generate(target, NoDrafter(target), p, Sampling(0.0), Request(24), gamma=0)
                assert a.tokens == ar.tokens


def test_use_speed_path_puts_a_script_on_the_step_with_the_plain_paths_tokens():
    """minispec.use_speed_path, the README's call for a script: each model the CPU step serves
    takes it (None and others left plain), and the draft model's chain then comes in one call,
    with the plain path's greedy tokens."""
    import minispec

    plain_t, plain_d = load("shipped:target", device="cpu"), load("shipped:draft", device="cpu")
    target, draft = load("shipped:target", device="cpu"), load("shipped:draft", device="cpu")
    odd = random_model(tiny_config("qwen3"), seed=0)  # the step does not serve Qwen3
    minispec.use_speed_path(target, draft, None, odd)
    assert target.fast_steps is not None and draft.fast_steps is not None
    assert getattr(odd, "fast_steps", None) is None
    assert getattr(plain_t, "fast_steps", None) is None
    ids = target.tokenizer.encode("import os\n")
    kw = {"gamma": 4, "max_new_tokens": 32, "temperature": 0.0}
    fast = minispec.speculative_generate(
        target, minispec.make_drafter("model", target, draft_model=draft), ids, **kw)
    slow = minispec.speculative_generate(plain_t, plain_d, ids, **kw)
    assert fast.tokens == slow.tokens and fast.stats.rounds == slow.stats.rounds


def test_calls_the_step_does_not_serve_take_the_plain_path():
    """More than MAX_TOKENS tokens (a prefill) is model.py's call, bit for bit."""
    plain, fast, (a, b) = _warm_pair("llama", 7, np.random.default_rng(1), 0)
    toks = list(range(1, cpu_steps.MAX_TOKENS + 4))
    assert np.array_equal(fast.hidden_states(toks, b), plain.hidden_states(toks, a))


def test_the_silu_loop_is_model_silu_within_a_few_ulp():
    """kernels.silu (tanh a rational function, so the loop vectorizes) against model.silu in
    float64, times up: within 2.5e-7 |x up| (NumPy's float32 silu: 1.5e-7); NaN and +-inf as NumPy's
    float32 silu gives them; the same bits for a row alone and in a block of rows."""
    from minispec.core.model import silu
    from minispec.kernels import compiled

    x = np.concatenate([np.linspace(-30, 30, 20001), np.logspace(-30, 1, 301),
                        -np.logspace(-30, 1, 301)]).astype(np.float32)
    up = np.random.default_rng(0).uniform(-2, 2, x.size).astype(np.float32)
    got = x.reshape(1, -1).copy()
    compiled().silu(got, up.reshape(1, -1))
    want = silu(np, x.astype(np.float64)) * up
    assert np.all(np.abs(got[0] - want) <= 2.5e-7 * np.abs(x * up) + 1e-37)
    special = np.array([[np.nan, np.inf, -np.inf, 0.0, 100.0, -100.0]], np.float32)
    ones = np.ones_like(special)
    with np.errstate(invalid="ignore"):
        numpy_way = silu(np, special) * ones
    compiled().silu(special, ones)
    np.testing.assert_array_equal(special, numpy_way)
    rows = got.reshape(-1)[:4096].reshape(4, 1024).copy()
    alone = rows.copy()
    compiled().silu(rows, np.ones_like(rows))
    for r in range(4):
        one = alone[r:r + 1].copy()
        compiled().silu(one, np.ones_like(one))
        assert np.array_equal(one[0], rows[r])


def test_the_silu_loop_has_the_same_bits_whoever_compiles_it_first():
    """kernels.silu compiled first as the callee of a fastmath loop (as _mlp_out compiles it)
    gives the bits it gives compiled alone: its flags are its own (kernels.SILU_FLAGS), not
    its first caller's."""
    numba = pytest.importorskip("numba")
    from minispec import kernels

    kernels.compiled()  # the intrinsics the loop calls
    alone = numba.njit(**kernels.SILU_FLAGS)(kernels._silu_kernel)
    inside = numba.njit(**kernels.SILU_FLAGS)(kernels._silu_kernel)
    caller = numba.njit(fastmath=True)(lambda gate, up: inside(gate, up))
    x = np.linspace(-9, 9, 4097, dtype=np.float32).reshape(1, -1)
    up = np.random.default_rng(1).uniform(-2, 2, x.shape).astype(np.float32)
    got = [x.copy() for _ in range(3)]
    caller(got[0], up)  # compiles `inside` within the fastmath caller
    inside(got[1], up)
    alone(got[2], up)
    assert np.array_equal(got[0], got[2]) and np.array_equal(got[1], got[2])


def test_supported_says_why_not():
    qwen3 = random_model(tiny_config("qwen3"), seed=0)
    assert "Qwen3" in cpu_steps.supported(qwen3)
    with pytest.raises(MinispecError, match="cpu_steps: .*Qwen3"):
        cpu_steps.enable(qwen3)
    cpu_steps.enable_where_supported(qwen3)  # left plain, no error
    assert getattr(qwen3, "fast_steps", None) is None
    half = random_model(tiny_config("llama"), seed=0, dtype="float16")
    assert "float32" in cpu_steps.supported(half)
