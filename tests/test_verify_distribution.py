"""The judge (minispec/judge/, run by verify_distribution.py): the quick run passes, outside
samplers, generators and drafters are judged, the statistics.

The script's own run is the distribution test of minispec's verify step and speculative loop;
here we check that it runs, that its verdict is right on outside samplers known to be exact or
broken, and the pieces its verdict rests on (G-test cells, Holm, Algorithm 1's round lengths).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minispec.judge import pipeline, selftest, verify_step
from minispec.judge import stats as judge_stats

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    return subprocess.run([sys.executable, str(ROOT / "verify_distribution.py"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def test_quick_run_passes_with_every_row():
    r = run_script("--quick")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    for case in ("dirichlet V=16 g=4", "q == p", "disjoint", "one-hot q", "near-zero",
                 "close draft"):
        assert f"1    {case}" in out
    for test in ("tokens by index", "next token | token", "tokens/round", "joint of"):
        assert test in out
    assert "L=3, near" in out and "T=0 g=3 L=4" in out
    for tree in ("without-replacement", "deterministic", "model-tree 2,2,1", "medusa 3,2,1",
                 "eagle chain", "eagle 2,2,1", "eagle-2 3,2,2"):
        assert tree in out  # the tree rows: verify_tree alone, the tree drafters end to end
    for part, bug in [("1", "residual=p"), ("1", "no bonus"), ("1", "accept q/p"),
                      ("1", "unwarped q"), ("2", "residual=p"), ("2", "accept q/p"),
                      ("2", "unwarped q"), ("T", "tree residual"),
                      ("T", "proposal not renormalized"), ("T", "top-k as sampled")]:
        line = next(x for x in out.splitlines() if x.startswith(f"{part:<4} {bug:<15}"))
        assert line.endswith("rejected") and "NOT" not in line, line
    assert "Holm over the" in out and "Kolmogorov-Smirnov" in out
    assert "PASS:" in out and "FAIL" not in out


def test_help_says_what_each_part_tests_how_long_what_pass_means_and_the_exit_codes():
    r = subprocess.run([sys.executable, "-m", "minispec", "judge", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    for part in ("1 a verify step alone", "2 minispec's whole loop", "T the tree walk",
                 "3 the shipped pair", "4 the controls", "G with --generator",
                 "D with --drafter"):
        assert part in out
    for words in ("--quick 1 to 3 minutes", "full run about 10 minutes", "PASS means",
                  "Holm", "the controls' are meant to be tiny", "Exit status: 0 PASS; 1 FAIL",
                  "3 nothing was tested", "factory(target, draft)"):
        assert words in out


def test_outside_exact_sampler_passes():
    r = run_script("--quick", "--sampler", "samplers_for_tests:exact")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sampler samplers_for_tests:exact" in r.stdout


@pytest.mark.parametrize("broken", ["residual_is_p", "drop_bonus"])
def test_outside_broken_sampler_fails(broken):
    r = run_script("--quick", "--sampler", f"samplers_for_tests:{broken}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL:" in r.stdout


def test_bad_sampler_spec_is_reported():
    r = run_script("--quick", "--sampler", "no_colon_here")
    assert r.returncode != 0 and "module:function" in r.stderr


def test_g_parts_merges_small_cells_and_flags_impossible_draws():
    # expected 50, 45, 4, 1: the last two merge into an "other" cell of 5
    g, dof, impossible = judge_stats.g_parts([50, 45, 4, 1], [0.5, 0.45, 0.04, 0.01])
    assert (dof, impossible) == (2, 0) and g == pytest.approx(0.0, abs=1e-12)
    # expected 50, 47, 2, 1: "other" (3) is still too small and takes in the 47 cell too
    g, dof, _ = judge_stats.g_parts([50, 47, 2, 1], [0.5, 0.47, 0.02, 0.01])
    assert dof == 1 and g == pytest.approx(0.0, abs=1e-12)
    g_parts = judge_stats.g_parts
    assert g_parts([10, 0, 1], [0.5, 0.5, 0.0])[2] == 1  # one draw of a probability-0 cell
    assert g_parts([10, 1], [1.0, 1e-13])[2] == 1  # below IMPOSSIBLE counts as impossible
    fit = judge_stats.combine([judge_stats.g_parts([10, 0, 1], [0.5, 0.5, 0.0])])
    assert fit.pvalue == 0.0 and "impossible" in fit.note


def test_holm_adjusts_step_down():
    assert judge_stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_length_law_of_algorithm1():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6), 4), rng.dirichlet(np.ones(6), 3)
    law = verify_step.length_law(p, q)
    assert law.sum() == pytest.approx(1.0) and law[0] == 0.0
    assert verify_step.length_law(p, p[:3])[-1] == 1.0  # q == p: every round ends with a bonus
    disjoint = np.zeros((3, 6))
    disjoint[:, 0] = 1.0
    p[:, 0] = 0.0
    assert verify_step.length_law(p / p.sum(1, keepdims=True), disjoint)[1] == 1.0


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("torch") is None,
                    reason="needs transformers and torch")
def test_hf_adapter_emits_a_verify_result():
    from minispec.hf_adapter import verify

    rng = np.random.default_rng(1)
    V, g = 8, 4
    p, q = rng.dirichlet(np.ones(V), g + 1), rng.dirichlet(np.ones(V), g)
    drafts = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
    for _ in range(50):
        out = verify(p, q, drafts, rng)
        assert out.dtype == np.int64 and 1 <= len(out) <= g + 1
        assert np.array_equal(out[:-1], drafts[: len(out) - 1])
    assert len(verify(p[:1], q[:0], drafts[:0], rng)) == 1  # gamma 0
    a = verify(p, q, drafts, np.random.default_rng(7))
    assert np.array_equal(a, verify(p, q, drafts, np.random.default_rng(7)))  # seeded


# ---- part G: whole pipelines (--generator) ------------------------------------------------------


def test_minispec_pipeline_passes_and_every_planted_bug_is_rejected():
    r = run_script("--generator", "minispec.generators:speculative", "--quick")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "G    T=1.5 top_k=2 L=3, near, prompt of 7" in out
    for bug in pipeline.PIPELINE_BUGS:
        line = next(x for x in out.splitlines() if x.startswith(f"G    {bug:<15}"))
        assert line.endswith("rejected") and "NOT" not in line, line
    assert "PASS: 1/1 true tests pass, 4/4 controls rejected" in out


@pytest.mark.parametrize("spec, code, message", [
    ("drafters_for_tests:exact", 0, "PASS: 3/3 true tests pass, 2/2 controls rejected"),
    ("drafters_for_tests:greedy", 1, "FAIL:"),
])
def test_a_drafter_of_ones_own_is_judged_in_generate_and_generate_batch(spec, code, message):
    # a tree drafter written against the public contract, through --drafter, unchanged
    r = run_script("--drafter", spec, "--quick", "--samples", "400")
    assert r.returncode == code, r.stdout + r.stderr
    assert message in r.stdout and "lookup-tree, batch" in r.stdout


@pytest.mark.parametrize("spec, code, message", [
    ("generators_for_tests:greedy_draft", 1, "FAIL: 0/1 true tests pass"),
    ("generators_for_tests:too_short", 1, "returned 2 tokens, expected 3"),
    ("needs_missing_package:factory", 3, "a_package_that_is_not_installed"),
])
def test_outside_generators_are_judged(spec, code, message):
    r = run_script("--generator", spec, "--quick", "--samples", "200")
    assert r.returncode == code, r.stdout + r.stderr
    assert message in r.stdout + r.stderr


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("torch") is None,
                    reason="the transformers adapter needs torch and transformers "
                    "(pip install 'minispec[parity]'; CI installs them)")
def test_transformers_assisted_generation_end_to_end(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    # the pair the judge writes is what transformers reads: the same logits as minispec's
    dirs = pipeline.write_pair(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.float32)
    ids = [4, 2, 11, 7, 4, 2, 11]
    with torch.inference_mode():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(theirs, selftest.tiny_models()["target"].logits(ids), atol=1e-4)
    r = run_script("--generator", "minispec.hf_generators:assisted", "--quick", "--samples",
                   "200")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS: 1/1 true tests pass, 4/4 controls rejected" in r.stdout


def test_a_sampler_whose_dependency_is_missing_is_not_judged(tmp_path):
    (tmp_path / "needs_nothing_here.py").write_text(
        "REQUIRES = ('a_package_that_is_not_installed',)\n"
        "def verify(p, q, d, rng):\n    raise AssertionError('never called')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = subprocess.run([sys.executable, str(ROOT / "verify_distribution.py"), "--quick",
                        "--sampler", "needs_nothing_here:verify"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "needs a_package_that_is_not_installed" in r.stderr and "FAIL" not in r.stdout
