"""--html (minispec/html_trace.py): the recorded uniforms are the ones verify drew, so each
verdict on the page is the real one; the generation is unchanged; the page is written. The same
for a tree drafter, whose walk minispec.tree.verify_tree records itself."""

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec.html_trace import TracedVerify, page
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(n_layers=1), seed=0, scale=0.4)


def test_the_traced_verify_records_the_uniforms_verify_used():
    rng = np.random.default_rng(0)
    traced = TracedVerify()
    for trial in range(200):
        V, g = int(rng.integers(2, 6)), int(rng.integers(0, 5))
        p, q = rng.dirichlet(np.ones(V), g + 1), rng.dirichlet(np.ones(V), g)
        drafts = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
        plain = minispec.verify(p, q, drafts, np.random.default_rng(trial))
        out = traced(p, q, drafts, np.random.default_rng(trial))
        assert out.tolist() == plain.tolist()  # the same step, the same draws
        call = traced.calls[-1]
        kept = [s["kept"] for s in call["steps"]]
        assert sum(kept) == len(out) - 1 and kept == sorted(kept, reverse=True)
        assert call["rejected"] == (len(out) - 1 < g)
        for s in call["steps"]:  # the verdict is the rule applied to the recorded r
            assert s["kept"] == (s["r"] * s["q"] < s["p"])
        assert call["final"] == out[-1] and call["final_prob"] > 0


def test_a_generation_traced_is_the_same_generation_and_its_page_is_written(tmp_path):
    kw = {"gamma": 3, "max_new_tokens": 20, "temperature": 1.0, "seed": 5}
    plain = minispec.speculative_generate(TARGET, DRAFT, [3, 17, 5], **kw)
    traced = TracedVerify()
    out = minispec.speculative_generate(TARGET, DRAFT, [3, 17, 5], verify=traced, **kw)
    assert out.tokens == plain.tokens and len(traced.calls) == out.stats.target_calls
    html = page("x", out, traced, lambda ids: " ".join(map(str, ids)), "a title")
    assert html.count("<section>") == out.stats.target_calls
    assert f"<b>{out.stats.new_tokens}</b> tokens" in html and "a title" in html


def test_a_traced_tree_walk_is_the_walk_and_each_verdict_is_its_rule():
    """verify_tree asked to record its walk draws the same uniforms and returns the same path and
    token; each recorded verdict is u s(x) < r(x); the kept children are the path."""
    from minispec.tree import verify_tree

    rng = np.random.default_rng(1)
    for trial in range(200):
        V, n = int(rng.integers(2, 6)), int(rng.integers(1, 8))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        p, q = rng.dirichlet(np.ones(V), n + 1), rng.dirichlet(np.ones(V), n)
        tokens = [int(rng.choice(V, p=row)) for row in q]
        siblings = ["independent", "without-replacement", "deterministic"][trial % 3]
        plain = verify_tree(p, q, tokens, parents, siblings, np.random.default_rng(trial))
        trace: list = []
        gen = np.random.default_rng(trial)
        assert verify_tree(p, q, tokens, parents, siblings, gen, trace) == plain
        assert gen.random() == (g := np.random.default_rng(trial), verify_tree(
            p, q, tokens, parents, siblings, g), g.random())[2]  # the same draws after it
        *steps, last = trace
        assert [s["node"] for s in steps if s["kept"]] == plain[0]
        for s in steps:
            assert s["kept"] == (s["u"] * s["s"] < s["r"]) and s["token"] == tokens[s["node"]]
        assert last["last"][plain[1]] > 0


def test_a_tree_drafter_traced_is_the_same_generation_and_its_page_shows_the_trees():
    from minispec.drafters.tree_model import TreeModelDrafter

    kw = {"gamma": 3, "max_new_tokens": 20, "temperature": 1.0, "seed": 5}
    plain = minispec.speculative_generate(TARGET, TreeModelDrafter(TARGET, DRAFT, (2, 2, 1)),
                                          [3, 17, 5], **kw)
    traced = TracedVerify()
    out = minispec.speculative_generate(TARGET, TreeModelDrafter(TARGET, DRAFT, (2, 2, 1)),
                                        [3, 17, 5], verify=traced, **kw)
    assert out.tokens == plain.tokens and len(traced.calls) == out.stats.target_calls
    trees = [(rd, call) for rd, call in zip(out.stats.rounds, traced.calls) if call.get("tree")]
    assert len(trees) >= out.stats.target_calls - 2  # near the end a round may draft a chain
    for rd, call in trees:
        assert len(call["path"]) == rd.accepted and call["final"] == rd.emitted[-1]
        assert [call["tokens"][c] for c in call["path"]] == rd.emitted[:rd.accepted]
    html = page("x", out, traced, lambda ids: " ".join(map(str, ids)), "a title")
    assert html.count("<section>") == out.stats.target_calls
    assert html.count("over a tree of") == len(trees) and "A <b>tree</b> round" in html


def test_a_custom_tree_walk_is_checked():
    """A custom verify's verify_tree runs in the loop; what it returns is checked (a path of
    the tree from a root, one token), and one without verify_tree meets a tree with an error."""
    from minispec.drafters.tree_model import TreeModelDrafter
    from minispec.errors import MinispecError

    def chain_only(p, q, d, rng):
        return minispec.verify(p, q, d, rng)

    class BadWalk:
        __name__ = "bad_walk"

        def __call__(self, p, q, d, rng):
            return minispec.verify(p, q, d, rng)

        def verify_tree(self, p, q, tokens, parents, siblings, rng):
            return [1, 0], 0  # node 1 is not node 0's child in a 2,2,1 tree

    for verify, says in [(chain_only, "verifies chains"), (BadWalk(), "bad_walk")]:
        with pytest.raises(MinispecError, match=says):
            minispec.speculative_generate(TARGET, TreeModelDrafter(TARGET, DRAFT, (2, 2, 1)),
                                          [3, 17, 5], gamma=3, max_new_tokens=5,
                                          temperature=1.0, seed=0, verify=verify)


def test_check_walk_takes_a_root_to_node_path_and_one_token():
    from minispec.errors import MinispecError
    from minispec.tree import check_walk

    parents = [-1, 0, 0, 1]  # 0 under the context, 1 and 2 under 0, 3 under 1
    assert check_walk([0, 1, 3], 4, parents, 5, None) == [0, 1, 3]
    assert check_walk(np.array([0, 2]), np.int64(1), parents, 5, None) == [0, 2]
    assert check_walk((), 0, parents, 5, None) == []  # every child of the context rejected
    for path, token in [([1], 3), ([0, 3], 2), ([0], 5), ([0], True), ([0.0], 1), (None, 1)]:
        with pytest.raises(MinispecError, match="root-to-node path"):
            check_walk(path, token, parents, 5, None)
