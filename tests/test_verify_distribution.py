"""The judge (minispec/judge/, run by verify_distribution.py): the quick run passes, outside
samplers, generators and drafters are judged, the statistics.

The script's own run is the distribution test of minispec's verify step and speculative loop;
here we check that it runs, that its verdict is right on outside samplers known to be exact or
broken, and the pieces its verdict rests on (G-test cells, Holm, Algorithm 1's round lengths).
The judge runs in-process (minispec.judge.main(argv), output from capsys); one test starts the
script itself. Its command line's checks: tests/test_judge_command_line.py; its power:
tests/test_judge_power.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minispec.judge import main, pipeline, selftest, verify_step
from minispec.judge import stats as judge_stats
from minispec.judge.main import report

ROOT = Path(__file__).resolve().parents[1]


def judge(capsys, *args: str) -> tuple[int, str, str]:
    """minispec.judge.main(args) in this process -> (exit status, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_quick_run_passes_with_every_row(capsys):
    code, out, err = judge(capsys, "--quick")
    assert code == 0, out + err
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
    # every true test states its power: the eps column, and the summary's range
    header = next(x for x in out.splitlines() if x.startswith("part configuration"))
    assert "eps 90%" in header
    disjoint = next(x for x in out.splitlines() if x.startswith("1    disjoint")
                    and "tokens by index" in x)
    assert 0.01 < float(disjoint.split()[-2]) < 0.2, disjoint  # eps of 5,000 tokens over 8
    power = next(x for x in out.splitlines() if x.startswith("Power:"))
    assert "probability 0.9" in power and "0.01/35" in power


def test_the_script_prints_its_help_and_exits_0():
    # the one test that starts verify_distribution.py itself: the entry a checkout runs
    r = subprocess.run([sys.executable, str(ROOT / "verify_distribution.py"), "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    for part in ("1 a verify step alone", "2 minispec's whole loop", "T the tree walk",
                 "3 the shipped pair", "4 the controls", "G with --generator",
                 "D with --drafter"):
        assert part in out
    for words in ("--quick about 25 s", "the full run about 3 minutes", "PASS means",
                  "Holm", "the controls' are meant to be tiny", "What a PASS rules out",
                  "eps 90%", "4x the --samples halve it", "Exit status: 0 PASS; 1 FAIL",
                  "2 the command line could not be used", "3 nothing was tested",
                  "factory(target, draft)", "1/sqrt(samples)"):
        assert words in out, words


@pytest.mark.slow
def test_outside_exact_sampler_passes(capsys):
    code, out, err = judge(capsys, "--quick", "--sampler", "samplers_for_tests:exact")
    assert code == 0, out + err
    assert "sampler samplers_for_tests:exact" in out and "PASS:" in out


@pytest.mark.parametrize("broken", ["residual_is_p", "drop_bonus"])
def test_outside_broken_sampler_fails(broken, capsys):
    # part 1 on the quick configurations and the report, without the controls (the exact
    # sampler's run above shows them rejected): the verdict is FAIL, exit 1
    import samplers_for_tests

    sampler = getattr(samplers_for_tests, broken)
    rows = verify_step.part1(sampler, "true", verify_step.verify_cases(quick=True), 5000, 0)
    assert report(rows, [], [], None, time.perf_counter()) == 1
    out = capsys.readouterr().out
    assert "FAIL:" in out


def test_g_parts_merges_small_cells_and_flags_impossible_draws():
    # expected 50, 45, 4, 1: the last two merge into an "other" cell of 5
    g, dof, impossible, cells = judge_stats.g_parts([50, 45, 4, 1], [0.5, 0.45, 0.04, 0.01])
    assert (dof, impossible) == (2, 0) and g == pytest.approx(0.0, abs=1e-12)
    # the cells compared, for the power figure: p and uniform noise's u, merged alike
    assert cells.p == pytest.approx([0.45, 0.5, 0.05]) and cells.u == pytest.approx([.25, .25, .5])
    assert list(cells.n) == [100] * 3
    # expected 50, 47, 2, 1: "other" (3) is still too small and takes in the 47 cell too
    g, dof, _, _ = judge_stats.g_parts([50, 47, 2, 1], [0.5, 0.47, 0.02, 0.01])
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


@pytest.mark.slow  # importing torch and transformers: seconds
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


@pytest.mark.slow
def test_minispec_pipeline_passes_and_every_planted_bug_is_rejected(capsys):
    code, out, err = judge(capsys, "--generator", "minispec.generators:speculative", "--quick")
    assert code == 0, out + err
    assert "G    T=1.5 top_k=2 L=3, near, prompt of 7" in out
    for bug in pipeline.PIPELINE_BUGS:
        line = next(x for x in out.splitlines() if x.startswith(f"G    {bug:<15}"))
        assert line.endswith("rejected") and "NOT" not in line, line
    assert "PASS: 1/1 true tests pass, 4/4 controls rejected" in out


@pytest.mark.slow
@pytest.mark.parametrize("spec, code, message", [
    ("drafters_for_tests:exact", 0, "PASS: 3/3 true tests pass, 2/2 controls rejected"),
    ("drafters_for_tests:greedy", 1, "FAIL:"),
])
def test_a_drafter_of_ones_own_is_judged_in_generate_and_generate_batch(spec, code, message,
                                                                       capsys):
    # a tree drafter written against the public contract, through --drafter, unchanged
    got, out, err = judge(capsys, "--drafter", spec, "--quick", "--samples", "400")
    assert got == code, out + err
    assert message in out and "lookup-tree, batch" in out


@pytest.mark.parametrize("spec, code, message", [
    ("generators_for_tests:greedy_draft", 1, "FAIL: 0/1 true tests pass"),
    ("generators_for_tests:too_short", 1, "returned 2 tokens, expected 3"),
    ("needs_missing_package:factory", 3, "a_package_that_is_not_installed"),
])
def test_outside_generators_are_judged(spec, code, message, capsys):
    got, out, err = judge(capsys, "--generator", spec, "--quick", "--samples", "200")
    assert got == code, out + err
    assert message in out + err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("torch") is None,
                    reason="the transformers adapter needs torch and transformers "
                    "(pip install 'minispec[parity]'; CI installs them)")
def test_transformers_assisted_generation_end_to_end(tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    # the pair the judge writes is what transformers reads: the same logits as minispec's
    dirs = pipeline.write_pair(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.float32)
    ids = [4, 2, 11, 7, 4, 2, 11]
    with torch.inference_mode():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(theirs, selftest.tiny_models()["target"].logits(ids), atol=1e-4)
    code, out, err = judge(capsys, "--generator", "minispec.hf_generators:assisted", "--quick",
                           "--samples", "200")
    assert code == 0, out + err
    assert "PASS: 1/1 true tests pass, 4/4 controls rejected" in out


def test_a_sampler_whose_dependency_is_missing_is_not_judged(tmp_path, monkeypatch, capsys):
    (tmp_path / "needs_nothing_here.py").write_text(
        "REQUIRES = ('a_package_that_is_not_installed',)\n"
        "def verify(p, q, d, rng):\n    raise AssertionError('never called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = judge(capsys, "--quick", "--sampler", "needs_nothing_here:verify")
    assert code == 3, out + err
    assert "needs a_package_that_is_not_installed" in err and out == ""
