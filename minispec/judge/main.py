"""The judge's command line and report: `python -m minispec judge` (or verify_distribution.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import time

import numpy as np
from scipy import stats

from ..core.verify import verify as minispec_verify
from ..drafters import PRESETS, make_drafter
from ..errors import MinispecError
from ..shipped import SHIPPED, display, path_arg
from .pipeline import PIPELINE_BUGS, part_pipeline
from .selftest import (
    BATCH_BUGS,
    MODEL,
    MODEL_PROMPT,
    MODEL_TREE_BUGS,
    judge_drafter,
    judge_drafter_on_model,
    part2,
    part2_batch,
    part2_drafters,
    part2_trees,
    part3,
)
from .stats import CONTROL_ALPHA, FAMILY_ALPHA, Row, fmt_p, holm
from .verify_step import BUGS, TREE_BUGS, broken_sampler, part1, part_tree, verify_cases

EXIT_PASS, EXIT_FAIL, EXIT_NOT_TESTED = 0, 1, 3  # 2: argparse's, a command line it cannot read

DESCRIPTION = """\
Is speculative sampling lossless? A statistical judge you can run.

Speculative sampling (Leviathan et al. 2023, Algorithm 1 and Theorem 3.1; Chen et al. 2023)
promises that the emitted tokens are distributed exactly as if the target alone had sampled
them. The judge samples many times and compares what comes out with the exact law (G-tests),
and shows its tests have power by running them, with the same sample budget, on deliberately
broken samplers (the controls).

What each part tests:
  1  a verify step alone, fn(p, q, draft_tokens, rng): the tokens at each index, the token
     after each token, and the tokens per round, on fixed p and q (V 8..32, gamma 0..8, q == p,
     disjoint supports, one-hot q, near-zero probabilities)
  2  minispec's whole loop end to end on tiny random models: the exact law of the next L tokens
     against speculative_generate over many seeds, for the model, n-gram, early-exit, tree,
     Medusa and EAGLE drafters, greedy included, and generate_batch
  T  the tree walk (minispec.tree.verify_tree) alone, siblings drawn i.i.d., without
     replacement, or as top-k
  3  the shipped pair in weights/ (full run only)
  4  the controls: the same tests on broken samplers, each of which must be rejected
  G  with --generator: a whole pipeline of your own (or transformers'), with planted bugs as
     controls
  D  with --drafter: a drafter of your own inside minispec's generate and generate_batch"""

EPILOG = """\
How long, on 2 CPU cores: --quick 1 to 3 minutes (about 150 s measured on a busy, shared
machine; the test suite runs it); the full run about 10 minutes; --generator --quick about
30 s for minispec's own pipeline; --drafter --quick under a minute for a small drafter.

PASS means: every true test passes after Holm's correction over all of them (family alpha
0.01: a correct sampler fails a run about 1 time in 100), and every control is rejected at
p < 1e-6. Counts in the summary: "N true tests" are the rows of the first table; the
Kolmogorov-Smirnov diagnostic uses those of them with a continuous p-value (a greedy row has
one possible outcome), so it names fewer. While it runs, each row's p-value is printed on
stderr; the controls' are meant to be tiny.

Exit status: 0 PASS; 1 FAIL (a true test failed, or a control was not rejected); 2 the command
line could not be read; 3 nothing was tested (a --sampler, --generator or --drafter module
names in REQUIRES a package that is not installed).

Examples:
  python -m minispec judge --quick
  python -m minispec judge --sampler mypkg.mymod:verify
  python -m minispec judge --generator minispec.generators:speculative --quick
  python -m minispec judge --drafter mypkg.mymod:make_drafter --quick"""


def load_spec(spec: str, flag: str, kind: str):
    """'module:name' (for --sampler, --generator, --drafter) -> that callable; the working
    directory is importable, like `python -m`. A module may name in REQUIRES the packages it
    needs: a missing one ends the run with status 3, nothing tested (not a verdict)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise SystemExit(f"{flag}: expected module:{kind}, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    missing = [m for m in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(m) is None]
    if missing:
        print(f"verify_distribution: {flag} {spec} needs {' and '.join(missing)}, not "
              f"installed here; nothing was tested (pip install {' '.join(missing)})",
              file=sys.stderr)
        raise SystemExit(EXIT_NOT_TESTED)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SystemExit(f"{flag}: {module_name} has no {kind} {name!r}")
    return fn


def print_table(rows: list[Row]) -> None:
    print(f"{'part':<4} {'configuration':<38} {'test':<28} {'samples':>8} {'G / dof':>15} "
          f"{'p-value':>8} {'Holm p':>8}  verdict")
    for r in rows:
        stat = f"{r.fit.stat:.1f} / {r.fit.dof}" if r.fit.dof else "-"
        verdict = "pass" if r.passed else "FAIL"
        exact_zero = r.fit.pvalue == 0 and r.fit.note  # an impossible outcome, not underflow
        p, adjusted = ("0", "0") if exact_zero else (fmt_p(r.fit.pvalue), fmt_p(r.adjusted))
        print(f"{r.part:<4} {r.config:<38} {r.test:<28} {r.samples:>8} {stat:>15} "
              f"{p:>8} {adjusted:>8}  {verdict}"
              + (f"  ({r.fit.note})" if r.fit.note else ""))


def judge_controls(controls: list[Row]) -> list[tuple[str, str, int, int, Row, float, bool]]:
    """Per (part, bug): the smallest p-value over its tests, Bonferroni-corrected by their count."""
    out = []
    for part, bug in dict.fromkeys((r.part, r.control) for r in controls):
        group = [r for r in controls if r.part == part and r.control == bug]
        best = min(group, key=lambda r: r.fit.pvalue)
        p = min(1.0, len(group) * best.fit.pvalue)
        out.append((part, bug, len(group), sum(r.samples for r in group), best, p,
                    p < CONTROL_ALPHA))
    return out


def plot(rows: list[Row], path: str) -> str:
    """Empirical against exact histograms, one panel per test that carries one."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--plot: matplotlib is not installed, {path} not written"
    panels = [r for r in rows if r.hist is not None and (r.part != "1" or r.config.startswith(
        ("dirichlet V=16", "one-hot", "near-zero", "close draft")))]
    if not panels:
        return f"--plot: no histogram to draw, {path} not written"
    cols = 3
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.2 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, panels):
        labels, exact, empirical = r.hist
        x = np.arange(len(labels))
        ax.bar(x - 0.2, exact, 0.4, label="exact")
        ax.bar(x + 0.2, empirical, 0.4, label=f"sampled (n={r.samples})")
        ax.set_xticks(x, labels, rotation=90 if r.part != "1" else 0, fontsize=7)
        where = "index 0" if r.part == "1" else "next tokens"
        ax.set_title(f"part {r.part}: {r.config}, {where}\np = {fmt_p(r.fit.pvalue)}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m minispec judge", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--sampler", metavar="MODULE:FUNCTION",
                      help="judge this verify step, fn(p, q, draft_tokens, rng) -> emitted "
                      "tokens, in parts 1 and 4 instead of minispec's (parts 2, 3, T skipped)")
    what.add_argument("--generator", metavar="MODULE:FACTORY",
                      help="judge this whole generation pipeline (part G) instead: "
                      "factory(target_dir, draft_dir) -> generate(prompt_ids, *, "
                      "max_new_tokens, temperature, top_k, top_p, seed) -> new token ids")
    what.add_argument("--drafter", metavar="MODULE:FACTORY",
                      help="judge this drafter in minispec's loop (part D) instead: "
                      "factory(target, draft) -> a minispec.Drafter made for target (two "
                      "minispec Models over 16 tokens; draft is smaller, use it or not); or "
                      "one of minispec's by name: " + ", ".join(PRESETS))
    ap.add_argument("--model", metavar="DIR", type=path_arg, default=None,
                    help="with --drafter: judge it on this model instead (a Hugging Face "
                    f"directory; draft is None), at T={MODEL.temperature:g} top-k {MODEL.top_k} "
                    f"over the next {MODEL.L} tokens of --prompt, and greedily; e.g. a "
                    "trained head on the target it was trained for")
    ap.add_argument("--prompt", metavar="TEXT", default=MODEL_PROMPT,
                    help="with --model: the text whose continuation is judged (default: "
                    "%(default)r); choose one where the drafter's own paths run, e.g. text that "
                    "repeats itself for a drafter that copies")
    ap.add_argument("--quick", action="store_true",
                    help="the CI subset: fewer configurations and samples (minutes, not tens)")
    ap.add_argument("--plot", metavar="PNG", help="also draw empirical against exact histograms "
                    "(needs matplotlib)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seeds the draws; the configurations tested are fixed (default 0)")
    ap.add_argument("--weights", default=str(SHIPPED),
                    help="the folder holding the shipped pair (target/, draft/) for part 3")
    ap.add_argument("--samples", type=int, default=None,
                    help="samples per configuration of --generator or --drafter (default: "
                    "600 quick, 1000 full for --generator; 800 quick, 2000 full for --drafter)")
    args = ap.parse_args(argv)
    if args.model is not None and not args.drafter:
        ap.error("--model: goes with --drafter (the drafter to judge on that model)")
    if args.prompt != MODEL_PROMPT and args.model is None:
        ap.error("--prompt: goes with --drafter NAME --model DIR (the tiny models' prompts are "
                 "fixed)")
    if not args.prompt:
        ap.error("--prompt: expected some text, got an empty string")
    t0 = time.perf_counter()
    for kind in OUTSIDE:
        if getattr(args, kind):
            return judge_outside(args, kind, t0)
    n_tokens = 5000 if args.quick else 20000  # part 1, per configuration and sampler
    n_e2e = 800 if args.quick else 2000  # part 2, per configuration and sampler
    n_shipped = 600  # part 3: a sample costs a few calls of the 5-layer target
    n_tree = 2000 if args.quick else 6000  # part T: L-token samples per tree configuration

    if args.sampler:
        sampler, name = load_spec(args.sampler, "--sampler", "function"), args.sampler
    else:
        sampler, name = minispec_verify, "minispec.verify"
    print(f"verify_distribution: {'quick' if args.quick else 'full'} run, seed {args.seed}, "
          f"sampler {name}")
    cases = verify_cases(args.quick)
    rows = part1(sampler, "true", cases, n_tokens, args.seed)
    controls = []
    for bug in BUGS:
        broken = minispec_verify if bug == "unwarped q" else broken_sampler(bug)
        controls += part1(broken, bug, cases, n_tokens, args.seed, control=bug)
    notes = []
    if args.sampler:
        notes.append("parts 2, 3 and T skipped: they test minispec's speculative_generate")
    else:
        e2e_rows, e2e_controls = part2(args.seed, args.quick, n_e2e, with_controls=True)
        rows += e2e_rows
        rows += part2_drafters(args.seed, args.quick, n_e2e)
        controls += e2e_controls
        batch_rows, batch_controls = part2_batch(args.seed, args.quick, n_e2e)
        rows += batch_rows
        controls += batch_controls
        tree_rows_, tree_controls = part_tree(args.seed, args.quick, n_tree, with_controls=True)
        rows += tree_rows_ + part2_trees(args.seed, args.quick, n_e2e)
        controls += tree_controls
        if args.quick:
            notes.append("part 3 skipped in --quick")
        else:
            shipped_rows, why = part3(args.seed, n_shipped, args.weights)
            rows += shipped_rows
            notes += [why] if why else []

    return report(rows, controls, notes, args.plot, t0)


MODEL_SAMPLES = 800  # --drafter with --model: a sample costs a few calls of a real model

# --generator and --drafter: (the judging function, samples quick/full, what one is, a note)
OUTSIDE = {
    "generator": (part_pipeline, (600, 1000), "calls",
                  "part G: a random Llama over 16 tokens and two drafts written as Hugging Face "
                  "directories; the law of the next L tokens enumerated with the target alone"),
    "drafter": (judge_drafter, (800, 2000), "samples",
                "part D: a random Llama over 16 tokens as the target, the law of its next L "
                "tokens enumerated with it alone; the drafter's own name labels its rows"),
}


def judge_outside(args, kind: str, t0: float) -> int:
    """--generator (part G, the planted pipeline bugs as controls) or --drafter (part D, the
    drafter in generate and generate_batch, a broken verify step as the controls)."""
    spec = getattr(args, kind)
    judge, sizes, unit, note = OUTSIDE[kind]
    if kind == "drafter" and spec in PRESETS:  # one of minispec's own, by name
        name, options = PRESETS[spec]
        factory = lambda target, draft: make_drafter(name, target, **options)  # noqa: E731
    else:
        factory = load_spec(spec, f"--{kind}", "factory")
    n = args.samples or (sizes[0] if args.quick else sizes[1])
    if kind == "drafter" and args.model is not None:
        n = args.samples or MODEL_SAMPLES
        note = (f"part D on {display(args.model)}: the law of the next {MODEL.L} tokens of "
                f"{args.prompt!r:.80} enumerated with the model alone; controls: the same "
                "drafter and model with a broken verify step (a chain drafter) or its trees "
                "verified against the wrong proposal (a tree drafter)")
    print(f"verify_distribution: {'quick' if args.quick else 'full'} run, seed {args.seed}, "
          f"{kind} {spec}, {n} {unit} per configuration")
    try:
        if kind == "drafter" and args.model is not None:
            rows, controls = judge_drafter_on_model(factory, spec, n, args.seed, args.model,
                                                    args.prompt)
        else:
            rows, controls = judge(factory, spec, args.quick, n, args.seed)
    except MinispecError as e:
        raise SystemExit(f"verify_distribution: {e}") from None
    return report(rows, controls, [note], args.plot, t0)


def report(rows: list[Row], controls: list[Row], notes: list[str], plot_path: str | None,
           t0: float) -> int:
    """Holm over the true rows, the controls judged, the tables printed; 0 = PASS, 1 = FAIL."""
    for r, adj in zip(rows, holm([r.fit.pvalue for r in rows])):
        r.adjusted = adj
        r.passed = adj >= FAMILY_ALPHA
    print()
    print_table(rows)
    tested = [r.fit.pvalue for r in rows if r.fit.dof > 0 and not r.fit.note]
    ks = stats.kstest(tested, "uniform") if len(tested) >= 2 else None
    if any(r.part == "2" for r in rows):
        print("Part 2 drafts: far = a smaller random model (most drafts rejected); near = the "
              "target's random weights drawn at 0.6x the scale (many accepted).")
    print(f"\nMultiple testing: Holm over the {len(rows)} true tests at family alpha "
          f"{FAMILY_ALPHA} (a test passes when its Holm-adjusted p-value is >= alpha).")
    if ks is not None:
        print(f"Diagnostic: the p-values of the {len(tested)} true tests with a continuous "
              f"p-value (not the other {len(rows) - len(tested)}: one possible outcome, or a "
              "draw of an impossible one) against U(0, 1), Kolmogorov-Smirnov "
              f"D = {ks.statistic:.3f}, p = {fmt_p(ks.pvalue)} (shown, not part of the verdict).")

    judged = judge_controls(controls)
    print(f"\nControls: broken samplers, same tests and sample budget; each must be rejected at "
          f"p < {CONTROL_ALPHA:g} (its smallest p-value times its number of tests, Bonferroni):"
          "\ntiny p-values here are the point, they show the tests can tell.")
    print(f"{'part':<4} {'control':<15} {'tests':>5} {'samples':>8}  {'smallest p at':<60} "
          f"{'p-value':>8}  verdict")
    for part, bug, m, n, best, p, rejected in judged:
        where = f"{best.config}: {best.test}"
        print(f"{part:<4} {bug:<15} {m:>5} {n:>8}  {where:<60} {fmt_p(p):>8}  "
              f"{'rejected' if rejected else 'NOT REJECTED'}")
    judged_bugs = {c.control for c in controls}
    for bug, text in {**BUGS, **BATCH_BUGS, **PIPELINE_BUGS, **TREE_BUGS,
                      **MODEL_TREE_BUGS}.items():
        if bug in judged_bugs:
            print(f"  {bug}: {text}")
    for note in notes:
        print(f"Note: {note}")
    if plot_path:
        print(plot(rows, plot_path))

    ok_rows = all(r.passed for r in rows)
    ok_controls = all(j[-1] for j in judged)
    print(f"\n{'PASS' if ok_rows and ok_controls else 'FAIL'}: "
          f"{sum(r.passed for r in rows)}/{len(rows)} true tests pass, "
          f"{sum(j[-1] for j in judged)}/{len(judged)} controls rejected, "
          f"{time.perf_counter() - t0:.1f} s")
    for line in advice(rows, ok_controls):
        print(line)
    return EXIT_PASS if ok_rows and ok_controls else EXIT_FAIL


def advice(rows: list[Row], ok_controls: bool) -> list[str]:
    """What a FAIL asks of the user next: chance or a bug, and how to tell them apart."""
    out = []
    failed = [r for r in rows if not r.passed]
    outright = [r for r in failed if r.fit.note]  # an impossible draw, or an error
    if outright:
        out.append(f"{outright[0].config}, {outright[0].test}: {outright[0].fit.note}. "
                   "That is a bug, not chance.")
    elif failed:
        out.append(f"An exact sampler fails here about once in {round(1 / FAMILY_ALPHA)} runs "
                   f"(family alpha {FAMILY_ALPHA}): rerun with another --seed (and, with "
                   "--generator or --drafter, more --samples). A bias fails again, with smaller "
                   "p-values as the samples grow; chance does not.")
    if not ok_controls:
        out.append("A control not rejected: the tests had too little power to see that bug at "
                   "this budget (with --generator or --drafter, raise --samples).")
    return out
