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
from .stats import CONTROL_ALPHA, FAMILY_ALPHA, POWER, Row, fmt_p, holm, reach
from .verify_step import BUGS, TREE_BUGS, broken_sampler, part1, part_tree, verify_cases

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_TESTED = 0, 1, 2, 3

DESCRIPTION = """\
Is speculative sampling lossless? A statistical judge you can run.

Speculative sampling (Leviathan et al. 2023, Algorithm 1 and Appendix A.1; Chen et al. 2023)
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
How long, on 2 CPU cores of an AVX-512 machine (about 1.5x that on an AVX2 one: --quick took
34-40 s there): --quick about 25 s (the test suite runs it); the full run about 3 minutes;
--generator or --drafter with --quick about 5 s for minispec's own pipeline or drafter (an
outside one takes as long as its generate calls), without --quick 10 to 15 s.

PASS means: every true test passes after Holm's correction over all of them (family alpha
0.01: a correct sampler fails a run about 1 time in 100), and every control is rejected at
p < 1e-6. Counts in the summary: "N true tests" are the rows of the first table; the
Kolmogorov-Smirnov diagnostic uses those of them with a continuous p-value (a greedy row has
one possible outcome), so it names fewer. While it runs, each row's p-value is printed on
stderr; the controls' are meant to be tiny.

What a PASS rules out: the column "eps 90%" gives, for each true test, the smallest share eps
of uniform noise the test catches with probability 0.9 at its sample size and its Holm
threshold (a sampler drawing from (1 - eps) p + eps u, u uniform over the outcomes the exact
law p allows; its total-variation distance from p is at most eps). Smaller deviations may pass.
eps shrinks as 1/sqrt(samples): 4x the --samples halve it, at 4x the time.

Exit status: 0 PASS; 1 FAIL (a true test failed, or a control was not rejected); 2 the command
line could not be used (one line on stderr names the argument and what was expected; the
arguments are all checked before the run starts); 3 nothing was tested (a --sampler,
--generator or --drafter module names in REQUIRES a package that is not installed).

Examples:
  python -m minispec judge --quick
  python -m minispec judge --sampler mypkg.mymod:verify
  python -m minispec judge --generator minispec.generators:speculative --quick
  python -m minispec judge --drafter mypkg.mymod:make_drafter --quick"""

PROG = "python -m minispec judge"
MODEL_SAMPLES = 800  # --drafter with --model: a sample costs a few calls of a real model
# what each flag's MODULE:NAME must name
EXPECTED = {"--sampler": "a function fn(p, q, draft_tokens, rng) -> emitted tokens",
            "--generator": "a factory(target_dir, draft_dir) -> generate",
            "--drafter": "a factory(target, draft) -> a minispec.Drafter"}


class NotTested(MinispecError):
    """A judged module names in REQUIRES a package that is not installed: exit 3, no verdict."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is a MinispecError: main prints it as one line."""

    def error(self, message: str):
        raise MinispecError(message)


MAX_SAMPLES = 10_000_000  # --samples: a full run's 2,000 a configuration take seconds


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def seed_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def load_spec(spec: str, flag: str):
    """'module:name' (for --sampler, --generator, --drafter) -> that callable; the working
    directory is importable, like `python -m`. MinispecError when the module cannot be imported
    or has no such callable; NotTested when it names in REQUIRES a package not installed."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        presets = f"one of minispec's drafters ({', '.join(PRESETS)}) or " if flag == "--drafter" \
            else ""
        raise MinispecError(f"{flag}: expected {presets}MODULE:NAME naming {EXPECTED[flag]}, "
                            f"got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name + ".").startswith(e.name + "."):  # the module itself
            raise MinispecError(f"{flag} {spec}: no module {e.name!r} on the path (the working "
                                "directory or PYTHONPATH); expected MODULE:NAME naming "
                                f"{EXPECTED[flag]}") from None
        raise MinispecError(f"{flag} {spec}: importing {module_name} failed: {e} (a module may "
                            "name in REQUIRES the packages it needs)") from None
    except Exception as e:  # noqa: BLE001 (the user's module: name what went wrong, one line)
        raise MinispecError(f"{flag} {spec}: importing {module_name} raised "
                            f"{type(e).__name__}: {e}") from None
    missing = [m for m in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise NotTested(f"{flag} {spec} needs {' and '.join(missing)}, not installed here; "
                        f"nothing was tested (pip install {' '.join(missing)})")
    fn = getattr(module, name, None)
    if not callable(fn):
        raise MinispecError(f"{flag} {spec}: {module_name} has no {name!r}; expected "
                            f"{EXPECTED[flag]}")
    return fn


def check_plot(path: str) -> None:
    """--plot: matplotlib importable, a format it writes, a folder that exists (before any work)."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise MinispecError(f"--plot {path}: needs matplotlib, which is not installed: pip "
                            "install 'minispec[plot]' (or pip install matplotlib)") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in formats:
        raise MinispecError(f"--plot {path}: expected a file name ending in a format matplotlib "
                            f"writes ({', '.join('.' + f for f in sorted(formats))})")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise MinispecError(f"--plot {path}: the folder {folder} does not exist")


def print_table(rows: list[Row]) -> None:
    """The true tests, each with its reach (eps 90%, set by report)."""
    w = max([38] + [len(r.config) for r in rows])
    print(f"{'part':<4} {'configuration':<{w}} {'test':<28} {'samples':>8} {'G / dof':>15} "
          f"{'p-value':>8} {'Holm p':>8} {'eps 90%':>8}  verdict")
    for r in rows:
        stat = f"{r.fit.stat:.1f} / {r.fit.dof}" if r.fit.dof else "-"
        verdict = "pass" if r.passed else "FAIL"
        exact_zero = r.fit.pvalue == 0 and r.fit.note  # an impossible outcome, not underflow
        p, adjusted = ("0", "0") if exact_zero else (fmt_p(r.fit.pvalue), fmt_p(r.adjusted))
        print(f"{r.part:<4} {r.config:<{w}} {r.test:<28} {r.samples:>8} {stat:>15} "
              f"{p:>8} {adjusted:>8} {fmt_eps(r.reach):>8}  {verdict}"
              + (f"  ({r.fit.note})" if r.fit.note else ""))


def fmt_eps(eps: float) -> str:
    return "-" if math.isnan(eps) else ">1" if math.isinf(eps) else f"{eps:.3f}"


def power_summary(rows: list[Row]) -> str:
    """One line: the range of the true tests' reach, and how it scales with the samples."""
    reached = sorted((r for r in rows if not math.isnan(r.reach)), key=lambda r: r.reach)
    if not reached:
        return ("Power: every test here compares one cell (one possible outcome, or too few "
                "samples to fill two): only a draw of an impossible outcome could fail them.")
    lo, hi, median = reached[0], reached[-1], reached[len(reached) // 2]
    span = (f"eps = {fmt_eps(lo.reach)}" if lo.reach == hi.reach else
            f"eps from {fmt_eps(lo.reach)} (part {lo.part} {lo.config}, {lo.test}) to "
            f"{fmt_eps(hi.reach)} (part {hi.part} {hi.config}, {hi.test}), median "
            f"{fmt_eps(median.reach)}")
    return (f"Power: each true test catches with probability {POWER:g} a sampler that puts "
            f"uniform noise (over the outcomes the exact law allows) in a share eps of its "
            f"draws: {span}, at the Holm threshold {FAMILY_ALPHA:g}/{len(rows)}; smaller "
            "deviations may pass (column eps 90%; 4x the samples halve eps).")


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
    """Empirical against exact histograms, one panel per test that carries one (matplotlib's
    presence and the file's format were checked before the run: check_plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    try:
        fig.savefig(path, dpi=90)
    except (OSError, ValueError) as e:  # the verdict stands; say why the picture does not
        return f"--plot: {path} not written ({e})"
    finally:
        plt.close(fig)
    return f"wrote {path}"


def parser() -> Parser:
    ap = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
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
    ap.add_argument("--activations", choices=("float32", "int8"), default="float32",
                    help="with --model: int8 judges the model of int8 activations a GGUF "
                    "conversion makes (minispec.load's activations='int8'; AVX-512 VNNI)")
    ap.add_argument("--prompt", metavar="TEXT", default=MODEL_PROMPT,
                    help="with --model: the text whose continuation is judged (default: "
                    "%(default)r); choose one where the drafter's own paths run, e.g. text that "
                    "repeats itself for a drafter that copies")
    ap.add_argument("--quick", action="store_true",
                    help="the CI subset: fewer configurations and samples (seconds, not "
                    "minutes)")
    ap.add_argument("--plot", metavar="FILE", help="also draw empirical against exact "
                    "histograms, in a format matplotlib writes (.png, .pdf, .svg, ...; needs "
                    "matplotlib)")
    ap.add_argument("--seed", type=seed_int, default=0,
                    help="seeds the draws, an integer >= 0; the configurations tested are fixed "
                    "(default 0)")
    ap.add_argument("--weights", default=None,
                    help="with a full run of minispec's own tests: the folder holding the shipped "
                    "pair (target/, draft/) for part 3 (default: the shipped pair's folder, "
                    "weights/; part 3 skipped when absent)")
    ap.add_argument("--samples", type=positive_int, default=None,
                    help="with --generator or --drafter: samples per configuration (default: "
                    "600 quick, 1000 full for --generator; 800 quick, 2000 full for --drafter; "
                    f"{MODEL_SAMPLES} with --model). The trade-off: the smallest deviation a test "
                    "catches (eps 90%% in the report) shrinks as 1/sqrt(samples), 4x the samples "
                    "halve it, and the time grows with the samples; at most "
                    f"{MAX_SAMPLES:,}")
    return ap


def read_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line read and every argument checked, before any work: MinispecError (exit
    2) or NotTested (exit 3) otherwise. The judged callable, if any, comes back as args.judged."""
    args = parser().parse_args(argv)
    if args.model is not None and not args.drafter:
        raise MinispecError("--model: goes with --drafter (the drafter to judge on that model)")
    if args.activations != "float32" and args.model is None:
        raise MinispecError("--activations: goes with --drafter NAME --model DIR (a GGUF "
                            "conversion; the tiny models are float32)")
    if args.prompt != MODEL_PROMPT and args.model is None:
        raise MinispecError("--prompt: goes with --drafter NAME --model DIR (the tiny models' "
                            "prompts are fixed)")
    if not args.prompt:
        raise MinispecError("--prompt: expected some text, got an empty string")
    if args.model is not None and not (args.model / "config.json").is_file():
        raise MinispecError(f"--model {display(args.model)}: expected a model directory (a "
                            "Hugging Face one, with config.json), found no config.json there")
    if args.samples is not None and args.samples > MAX_SAMPLES:
        raise MinispecError(f"--samples: at most {MAX_SAMPLES:,} per configuration (the time "
                            f"grows with them; 4x the samples halve eps), got {args.samples:,}")
    if args.samples is not None and not (args.generator or args.drafter):
        raise MinispecError("--samples: goes with --generator or --drafter (minispec's own "
                            "tests have fixed sizes: --quick or the full run)")
    if args.weights is not None:
        if args.quick or args.sampler or args.generator or args.drafter:
            raise MinispecError("--weights: goes with a full run of minispec's own tests (part "
                                "3), not with --quick, --sampler, --generator or --drafter")
        missing = [d for d in ("target", "draft")
                   if not os.path.exists(os.path.join(args.weights, d, "config.json"))]
        if missing:
            raise MinispecError(f"--weights {args.weights}: expected the folders target/ and "
                                f"draft/ with a config.json each; {' and '.join(missing)} missing")
    if args.plot is not None:
        check_plot(args.plot)
    args.judged = None
    for flag in ("sampler", "generator", "drafter"):
        spec = getattr(args, flag)
        if spec and not (flag == "drafter" and spec in PRESETS):
            args.judged = load_spec(spec, f"--{flag}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the judge with command-line arguments `argv` -> the exit status (see --help)."""
    try:
        args = read_args(argv)
        return run(args)
    except NotTested as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_NOT_TESTED
    except MinispecError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    """The run the checked command line asks for: minispec's own tests, or an outside one's."""
    t0 = time.perf_counter()
    for kind in OUTSIDE:
        if getattr(args, kind):
            return judge_outside(args, kind, t0)
    n_tokens = 5000 if args.quick else 20000  # part 1, per configuration and sampler
    n_e2e = 800 if args.quick else 2000  # part 2, per configuration and sampler
    n_shipped = 600  # part 3: a sample costs a few calls of the 5-layer target
    n_tree = 2000 if args.quick else 6000  # part T: L-token samples per tree configuration

    if args.sampler:
        sampler, name = args.judged, args.sampler
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
            shipped_rows, why = part3(args.seed, n_shipped, args.weights or str(SHIPPED))
            rows += shipped_rows
            notes += [why] if why else []

    return report(rows, controls, notes, args.plot, t0)


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
        factory = args.judged
    n = args.samples or (sizes[0] if args.quick else sizes[1])
    if kind == "drafter" and args.model is not None:
        n = args.samples or MODEL_SAMPLES
        note = (f"part D on {display(args.model)}: the law of the next {MODEL.L} tokens of "
                f"{args.prompt!r:.80} enumerated with the model alone; controls: the same "
                "drafter and model with a broken verify step (a chain drafter) or its trees "
                "verified against the wrong proposal (a tree drafter)")
    print(f"verify_distribution: {'quick' if args.quick else 'full'} run, seed {args.seed}, "
          f"{kind} {spec}, {n} {unit} per configuration")
    if kind == "drafter" and args.model is not None:
        rows, controls = judge_drafter_on_model(factory, spec, n, args.seed, args.model,
                                                args.prompt, args.activations)
    else:
        rows, controls = judge(factory, spec, args.quick, n, args.seed)
    return report(rows, controls, [note], args.plot, t0)


def report(rows: list[Row], controls: list[Row], notes: list[str], plot_path: str | None,
           t0: float) -> int:
    """Holm over the true rows, the controls judged, the tables printed; 0 = PASS, 1 = FAIL."""
    for r, adj in zip(rows, holm([r.fit.pvalue for r in rows])):
        r.adjusted = adj
        r.passed = adj >= FAMILY_ALPHA
    alpha = FAMILY_ALPHA / max(1, len(rows))  # Holm's first step: one test's deviation
    for r in rows:
        r.reach = reach(r.fit, alpha)
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
    wb = max([15] + [len(j[1]) for j in judged])
    ww = max([60] + [len(f"{j[4].config}: {j[4].test}") for j in judged])
    print(f"{'part':<4} {'control':<{wb}} {'tests':>5} {'samples':>8}  {'smallest p at':<{ww}} "
          f"{'p-value':>8}  verdict")
    for part, bug, m, n, best, p, rejected in judged:
        where = f"{best.config}: {best.test}"
        print(f"{part:<4} {bug:<{wb}} {m:>5} {n:>8}  {where:<{ww}} {fmt_p(p):>8}  "
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
    print(power_summary(rows))
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
