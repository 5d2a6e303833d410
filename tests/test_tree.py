"""Trees of drafts (minispec/tree.py): the tree forward call and the cache after it, against a
plain recompute; verify_tree against verify on chains and against exact laws on trees; greedy
tree decoding against autoregressive decoding."""

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import minispec
from minispec.drafters.tree_model import TreeModelDrafter, check_shape, top_k, tree_size
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.tree import TreeDrafter, depths, hidden_tree, keep_path, verify_tree

# a tree of 7 nodes: two children of the context, the first with two children, ...
PARENTS = np.array([-1, -1, 0, 0, 1, 2, 5])


def _path_to(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_forward_equals_each_paths_recompute_and_the_kept_path_is_a_plain_cache(family):
    model = random_model(tiny_config(family), seed=1, scale=0.5)
    rng = np.random.default_rng(0)
    context = rng.integers(0, 48, 9).tolist()  # longer than mistral's window of 6
    tokens = rng.integers(0, 48, len(PARENTS))
    cache = model.new_cache(40)
    model.hidden_states(context[:-2], cache)  # the cache lacks the last two context tokens
    h = hidden_tree(model, context[-2:], tokens, PARENTS, cache)  # [2 + 7, D]
    logits = minispec.backend.to_host(model.lm_head(h))
    assert cache.length == len(context)
    for i in range(len(PARENTS)):  # node i's row = the last row of context + its path
        seq = context + [int(tokens[j]) for j in _path_to(PARENTS, i)]
        np.testing.assert_allclose(logits[2 + i], model.logits(seq)[-1], atol=2e-4)
    np.testing.assert_allclose(logits[1], model.logits(context)[-1], atol=2e-4)

    path = _path_to(PARENTS, 6)  # nodes 0 -> 2 -> 5 -> 6
    keep_path(cache, path)
    accepted = context + [int(tokens[j]) for j in path]
    assert cache.length == len(accepted)
    nxt = minispec.backend.to_host(model.forward([7], cache))[-1]  # the cache as a plain one
    np.testing.assert_allclose(nxt, model.logits(accepted + [7])[-1], atol=2e-4)


def test_a_tree_grown_level_by_level_equals_one_call():
    model = random_model(tiny_config(), seed=2, scale=0.5)
    tokens = np.array([5, 9, 11, 3, 30, 7, 8])
    full = model.new_cache(30)
    model.hidden_states([1, 2, 3], full)
    once = hidden_tree(model, [4], tokens, PARENTS, full)[1:]
    grown = model.new_cache(30)
    model.hidden_states([1, 2, 3], grown)
    first = hidden_tree(model, [4], tokens[:2], PARENTS[:2], grown)[1:]
    rest = hidden_tree(model, [], tokens, PARENTS, grown, done=2)
    np.testing.assert_allclose(np.concatenate([first, rest]), once, rtol=1e-5, atol=1e-4)


def test_verify_tree_on_a_chain_is_verify():
    rng = np.random.default_rng(3)
    for trial in range(300):
        V, g = int(rng.integers(2, 7)), int(rng.integers(0, 5))
        p = rng.dirichlet(np.ones(V) * 0.5, g + 1)
        q = rng.dirichlet(np.ones(V) * 0.5, g)
        drafts = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
        a = minispec.verify(p, q, drafts, np.random.default_rng(trial)).tolist()
        path, token = verify_tree(p, q, drafts, np.arange(g) - 1, "independent",
                                  np.random.default_rng(trial))
        assert [int(drafts[i]) for i in path] + [token] == a


def _tree_law(p_first, p_after, q, k, siblings, rng, n):
    """Draw n rounds of a depth-1 tree with k siblings drawn `siblings`-wise from q; return
    counts of (first emitted token) and (second token given the first was a kept draft)."""
    V = len(p_first)
    counts = np.zeros(V)
    for _ in range(n):
        if siblings == "deterministic":
            toks = np.argsort(-q, kind="stable")[:k]
        elif siblings == "independent":
            toks = rng.choice(V, size=k, p=q)
        else:
            toks = rng.choice(V, size=k, p=q, replace=False)
        P = np.vstack([p_first] + [p_after] * k)
        path, token = verify_tree(P, np.tile(q, (k, 1)), toks, np.full(k, -1), siblings, rng)
        counts[int(toks[path[0]]) if path else token] += 1
    return counts


@pytest.mark.parametrize("siblings", ["independent", "without-replacement", "deterministic"])
def test_verify_tree_emits_the_targets_law_for_each_way_of_drawing_siblings(siblings):
    rng = np.random.default_rng(4)
    V = 5
    p = np.array([0.05, 0.4, 0.3, 0.25, 0.0])  # one token the target never wants
    q = np.array([0.5, 0.05, 0.05, 0.1, 0.3])  # a poor proposal, mostly elsewhere
    n = 6000
    counts = _tree_law(p, rng.dirichlet(np.ones(V)), q, 3, siblings, rng, n)
    assert counts[4] == 0
    keep = p > 0
    assert stats.chisquare(counts[keep], n * p[keep]).pvalue > 1e-3


def test_the_tree_rule_matters_a_broken_residual_is_caught():
    # the same tree with the residual left un-updated after a rejected sibling: not the law
    import minispec.tree as tree

    rng = np.random.default_rng(5)
    p = np.array([0.05, 0.4, 0.3, 0.25, 0.0])
    q = np.array([0.5, 0.05, 0.05, 0.1, 0.3])
    original = tree.residual
    try:
        tree.residual = lambda r, s: r
        counts = _tree_law(p, np.ones(5) / 5, q, 3, "independent", rng, 6000)
    finally:
        tree.residual = original
    assert stats.chisquare(counts[:4], 6000 * p[:4]).pvalue < 1e-6


@pytest.mark.parametrize("shape", [(1,), (1, 1, 1), (2, 1), (3, 2, 1), (2, 2, 2), (4,)])
@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2"])
def test_greedy_tree_decoding_is_autoregressive_decoding(shape, family):
    target = random_model(tiny_config(family), seed=0, scale=0.5)
    draft = random_model(tiny_config(family, n_layers=1), seed=0, scale=0.4)
    drafter = TreeModelDrafter(target, draft, shape)
    for prompt in ([3, 17, 5], [9] * 11):
        base = minispec.autoregressive_generate(target, prompt, max_new_tokens=30,
                                                temperature=0.0)
        out = minispec.speculative_generate(target, drafter, prompt, gamma=4, max_new_tokens=30,
                                            temperature=0.0)
        assert out.tokens == base.tokens
        assert out.stats.tokens_per_target_call >= 1.0


def test_a_tree_near_the_end_of_the_context_is_pruned_not_refused():
    target = random_model(tiny_config(), seed=0, scale=0.5)  # context 64
    drafter = TreeModelDrafter(target, target, (3, 3, 2))  # a self-draft: every node agrees
    prompt = [3 + i % 40 for i in range(47)]
    base = minispec.autoregressive_generate(target, prompt, max_new_tokens=17, temperature=0.0)
    out = minispec.speculative_generate(target, drafter, prompt, gamma=3, max_new_tokens=17,
                                        temperature=0.0)
    assert out.tokens == base.tokens and len(out.tokens) == 17


def test_tree_shapes_and_bad_trees_are_named():
    assert check_shape("3,2,1") == (3, 2, 1) and tree_size((3, 2, 1)) == 3 + 6 + 6
    assert depths(PARENTS).tolist() == [0, 0, 1, 1, 1, 2, 3]
    for bad in ("", "3,x", (0, 1), (True,), (8, 8, 8), 5):
        with pytest.raises(MinispecError, match="tree"):
            check_shape(bad)
    target = random_model(tiny_config(), seed=0)

    class Bad(TreeDrafter):
        tree = True

        def propose(self, context, gamma, warp, rng):
            return minispec.Draft(np.array([1, 2]), np.full((2, 48), 1 / 48), np.array([1, -1]))

    with pytest.raises(MinispecError, match="parents"):
        minispec.speculative_generate(target, Bad(target), [3, 4], max_new_tokens=4,
                                      temperature=0.0)
    with pytest.raises(MinispecError, match="verify"):
        minispec.speculative_generate(target, TreeModelDrafter(target, target), [3, 4],
                                      max_new_tokens=4, temperature=0.0,
                                      verify=lambda p, q, d, r: d)


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_tree_drafters_run_in_a_batch_and_greedy_is_autoregressive(gamma):
    target = random_model(tiny_config(), seed=0, scale=0.5)
    draft = random_model(tiny_config(n_layers=1), seed=0, scale=0.4)
    prompts = [[3, 17, 5], [9] * 11, [4, 4, 8, 1]]
    for drafter in (TreeModelDrafter(target, draft, (2, 2, 1)),
                    minispec.drafters.random_medusa(target, 3, shape=(2, 1, 1))):
        out = minispec.generate_batch(target, drafter, prompts, gamma=gamma,
                                      max_new_tokens=20, temperature=0.0)
        for prompt, r in zip(prompts, out):
            base = minispec.autoregressive_generate(target, prompt, max_new_tokens=20,
                                                    temperature=0.0)
            assert r.tokens == base.tokens


def test_head_and_tree_drafters_on_each_device(device):
    """Medusa and EAGLE heads (chains, static trees, EAGLE-2's dynamic tree) and the draft
    model's tree, greedy, against autoregressive decoding: on the CPU and, when there is one,
    the GPU (a tree's verify call takes the plain path there, a chain's a CUDA graph if on)."""
    target = random_model(tiny_config(), seed=0, scale=0.5, device=device)
    draft = random_model(tiny_config(n_layers=1), seed=0, scale=0.4, device=device)
    drafters = {
        "model-tree 2,2,1": TreeModelDrafter(target, draft, (2, 2, 1)),
        "medusa": minispec.drafters.random_medusa(target, 3, seed=1, scale=0.3),
        "medusa 2,1,1": minispec.drafters.random_medusa(target, 3, seed=1, scale=0.3,
                                                        shape=(2, 1, 1)),
        "eagle": minispec.drafters.random_eagle(target, seed=1),
        "eagle 2,2,1": minispec.drafters.random_eagle(target, seed=1, shape=(2, 2, 1)),
        "eagle-2": minispec.drafters.random_eagle(target, seed=1, shape=(3, 2, 2),
                                                  dynamic=(2, 6)),
    }
    for prompt in ([3, 17, 5], [9] * 11):
        base = minispec.autoregressive_generate(target, prompt, max_new_tokens=20,
                                                temperature=0.0)
        for name, drafter in drafters.items():
            out = minispec.speculative_generate(target, drafter, prompt, gamma=3,
                                                max_new_tokens=20, temperature=0.0)
            assert out.tokens == base.tokens, (device, name)
            assert out.stats.drafted > 0, (device, name)


def test_a_tree_shaped_like_a_chain_is_a_chain_and_parents_alone_make_a_tree():
    # no flag says which kind a drafter drafts: the shape decides, the same way every round
    target = random_model(tiny_config(), seed=0, scale=0.5)
    seen = []

    class Shapes(TreeDrafter):
        def propose(self, context, gamma, warp, rng):
            if gamma < 2:
                return self.empty_draft()
            q = warp(minispec.backend.to_host(target.logits(context))[-1:])  # [1, V]
            x = int(np.argmax(q[0]))
            parents = np.array([-1, -1]) if len(context) % 2 else np.array([-1, 0])
            return minispec.Draft(np.array([x, (x + 1) % 48]), np.vstack([q, q]), parents,
                                  "deterministic")

    def spy(p, q, d, rng):  # a custom verify sees the chain-shaped rounds only
        seen.append(q.copy())
        return minispec.verify(p, q, d, rng)

    prompt = [3, 17, 5, 8]
    base = minispec.autoregressive_generate(target, prompt, max_new_tokens=12, temperature=0.0)
    out = minispec.speculative_generate(target, Shapes(target), prompt, gamma=2,
                                        max_new_tokens=12, temperature=0.0)
    assert out.tokens == base.tokens
    with pytest.raises(MinispecError, match="tree"):  # a branching round meets a chain verify
        minispec.speculative_generate(target, Shapes(target), [3, 17, 5], gamma=2,
                                      max_new_tokens=12, temperature=0.0, verify=spy)
    seen.clear()
    minispec.speculative_generate(target, Shapes(target), prompt, gamma=2, max_new_tokens=3,
                                  temperature=1.0, seed=0, verify=spy)
    # "deterministic" siblings on a chain: each draft was proposed with certainty, q one-hot
    assert seen[0].shape == (2, 48) and np.array_equal(seen[0].max(axis=1), [1.0, 1.0])


def test_auto_gamma_with_a_tree_sees_depths_not_node_counts():
    # a self-draft agrees with the target everywhere: every round keeps its whole path, so
    # gamma="auto" must never shrink the depth (it did when nodes were counted against the
    # kept path: a 2,2,1,1 tree of 12 nodes "rejected" 8 of them and fell to depth 1)
    target = random_model(tiny_config(), seed=0, scale=0.5)
    drafter = TreeModelDrafter(target, target, (2, 2, 1, 1))
    prompt = [3, 17, 5]
    out = minispec.speculative_generate(target, drafter, prompt, gamma="auto",
                                        max_new_tokens=41, temperature=0.0)
    base = minispec.autoregressive_generate(target, prompt, max_new_tokens=41, temperature=0.0)
    assert out.tokens == base.tokens
    assert out.stats.tokens_per_target_call > 4.0
    rounds = [r for r in out.stats.rounds if r.drafted]
    assert [r.depth for r in rounds[:-1]] == [4] * (len(rounds) - 1)
    assert all(r.accepted == r.depth for r in rounds)
    assert out.stats.acceptance_rate == 1.0  # kept positions / drafted positions, as for a chain


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([-np.inf, -2.0, -1.0, 0.0, 0.5, 1.0, np.inf, np.nan]), min_size=1,
                max_size=40), st.integers(1, 50))
def test_top_k_is_the_stable_sort(values, k):
    # a tree's candidates at temperature 0: top_k must pick exactly what a stable sort of the
    # logits picks (ties by lower id, -inf and NaN rows included), or greedy trees would differ
    row = np.array(values, dtype=np.float32)
    assert top_k(row, k) == [int(x) for x in np.argsort(-row, kind="stable")[:k]]
