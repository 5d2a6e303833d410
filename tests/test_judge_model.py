"""The judge on a model of one's choice (`judge --drafter NAME|MODULE:FACTORY --model DIR`): a
drafter's output against the exact law of that model's next tokens, with controls that are
rejected at the same budget; bad combinations named."""

import numpy as np
import pytest

from minispec.drafters import Draft, ModelDrafter, TreeModelDrafter
from minispec.errors import MinispecError
from minispec.judge import main
from minispec.judge.selftest import (
    MODEL,
    TREE_BUG,
    WrongTreeProposal,
    judge_drafter_on_model,
    tiny_models,
)
from minispec.loader import load, save_checkpoint
from minispec.tree import TreeDrafter


def test_a_drafter_on_a_model_passes_and_the_controls_are_rejected(tmp_path):
    models = tiny_models()
    save_checkpoint(models["target"], tmp_path / "tiny")
    rows, controls = judge_drafter_on_model(lambda t, d: ModelDrafter(t, models["near"]),
                                            "model", 400, 0, str(tmp_path / "tiny"))
    assert [r.config for r in rows] == [f"{MODEL.name}, model on tiny",
                                        "T=0 g=3 L=4, model on tiny"]
    assert all(r.fit.pvalue > 1e-3 for r in rows), [r.fit for r in rows]
    assert {c.control for c in controls} == {"residual=p", "accept q/p"}
    assert all(c.fit.pvalue < 1e-6 for c in controls), [c.fit for c in controls]


def test_a_tree_drafter_on_a_model_gets_a_tree_control_that_is_rejected(tmp_path):
    # a tree's rounds cannot take a broken chain verify step: its control plants the wrong
    # proposal in the draft instead (here sampled siblings, each given its parent's q)
    models = tiny_models()
    save_checkpoint(models["target"], tmp_path / "tiny")
    rows, controls = judge_drafter_on_model(
        lambda t, d: TreeModelDrafter(t, models["near"], (2, 2, 1)), "model-tree", 500, 0,
        str(tmp_path / "tiny"))
    assert all(r.fit.pvalue > 1e-3 for r in rows), [r.fit for r in rows]
    assert [c.control for c in controls] == [TREE_BUG]
    assert controls[0].fit.pvalue < 1e-6, controls[0].fit


class _Fixed(TreeDrafter):
    """Proposes the same draft every round."""

    def __init__(self, target, draft):
        super().__init__(target)
        self.draft = draft

    def propose(self, context, gamma, warp, rng):
        return self.draft


def test_the_tree_control_plants_the_wrong_proposal_and_leaves_chains_alone():
    target = tiny_models()["target"]
    q = np.eye(16)[[3, 5, 7]]  # three distinct rows
    tree = Draft(np.array([3, 5, 7]), q, np.array([-1, -1, 0]), "without-replacement")
    out = WrongTreeProposal(_Fixed(target, tree)).propose([1], 3, None, None)
    assert np.array_equal(out.q, q[[0, 1, 0]]) and out.siblings == "without-replacement"
    top_k = Draft(tree.tokens, q, tree.parents, "deterministic")
    out = WrongTreeProposal(_Fixed(target, top_k)).propose([1], 3, None, None)
    assert out.siblings == "independent" and np.array_equal(out.q, q)
    chain = Draft(np.array([3, 5]), q[:2])
    spy = WrongTreeProposal(_Fixed(target, chain), plant=False)
    assert spy.propose([1], 2, None, None) is chain and not spy.trees
    spy.inner.draft = tree
    assert spy.propose([1], 3, None, None) is tree and spy.trees


def judge(capsys, *args) -> tuple[int, str]:
    """The judge in this process -> (exit status, stderr)."""
    code = main(list(args))
    return code, capsys.readouterr().err


def test_the_judge_names_what_it_cannot_do_with_a_model(capsys):
    code, err = judge(capsys, "--model", "shipped:target")
    assert code == 2 and "--model: goes with --drafter" in err
    code, err = judge(capsys, "--drafter", "medusa")  # the tiny random target has no heads
    assert code == 2 and "no Medusa heads trained for this target" in err
    assert len(err.splitlines()) == 1, err


class _Spy(ModelDrafter):
    """Records the prompt of every generation it drafts for."""

    prompts: list = []

    def start(self, prompt_ids, cache):
        self.prompts.append(list(prompt_ids))
        super().start(prompt_ids, cache)


def test_the_prompt_judged_on_a_model_is_the_one_given(tmp_path, capsys):
    from minispec.shipped import SHIPPED

    target_dir = SHIPPED / "target"  # a model with a tokenizer
    spy = lambda t, d: _Spy(t, load(SHIPPED / "draft", device="cpu"))  # noqa: E731
    text = "def add(a, b):\n    return a + b\n"
    rows, _ = judge_drafter_on_model(spy, "spy", 20, 0, target_dir, text)
    assert {tuple(p) for p in _Spy.prompts} == {tuple(load(target_dir).tokenizer.encode(text))}
    assert len(rows) == 2
    save_checkpoint(tiny_models()["target"], tmp_path / "tiny")  # no tokenizer.json
    with pytest.raises(MinispecError, match="--prompt: .* has no tokenizer.json"):
        judge_drafter_on_model(near_model, "model", 20, 0, str(tmp_path / "tiny"), text)
    code, err = judge(capsys, "--drafter", "ngram", "--prompt", "x")
    assert code == 2 and "--prompt: goes with --drafter NAME --model DIR" in err


def test_minispec_real_judge_runs_the_judge_on_its_model(tmp_path, capsys):
    from minispec.real import main as real_main

    save_checkpoint(tiny_models()["target"], tmp_path / "tiny")
    # the drafter named after `judge` wins over real's default (eagle, whose heads the tiny
    # model does not have); 60 samples: the rows are there, the controls lack power (exit 1)
    code = real_main(["--model", str(tmp_path / "tiny"), "judge", "--drafter",
                      "test_judge_model:near_model", "--samples", "60"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "T=1.5 top_k=3 g=3 L=4, model on tiny" in out and "accept q/p" in out


def near_model(target, draft):
    return ModelDrafter(target, tiny_models()["near"])
