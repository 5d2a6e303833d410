"""`minispec sweep`: measured speedup against gamma, beside what Theorem 3.8 predicts.

For gamma = 1..8 the sweep runs speculative decoding over a prompt set and measures the
acceptance, the tokens each target call yields and the wall-clock speedup over autoregressive
decoding of the same prompts; from the measured alpha and cost ratio c it prints the speedup
Leviathan et al. 2023 (Theorem 3.8) predict, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)),
and recommends the gamma that was fastest.

    minispec sweep                                   # the pair and prompts shipped in weights/
    minispec sweep --drafter ngram --max-new-tokens 32 --plot sweep.png
    minispec sweep --target DIR --draft DIR --prompts prompts.json --json

Every quantity (alpha, c, the verify cost, the speedup, the EOS policy) is measured by the one
harness, minispec/measure/harness.py, exactly as `minispec bench` measures it; each gamma's costs
and speeds are taken together (the load of a shared machine drifts over a sweep). The n-gram
drafter has no forward call: its c is the lookup's measured seconds per round / gamma / target
step, so gamma c + 1 is still a round's cost in target steps. The theorem assumes a verify call
of gamma+1 tokens costs one decode step, and that every round drafts gamma tokens (the n-gram
drafter drafts none when nothing matches: there the prediction is an upper bound). Column
"pred+v" puts the measured cost of the verify call, t(gamma+1 tokens) / t(1 token) (column
"verify"), in place of that one step. The early-exit drafter's verify call skips the first k
layers of the positions it drafted, so it may beat both predictions. BLAS threads are pinned
(--threads, default 1) for the whole run: multi-threaded BLAS makes decode-sized matmuls slow on
a small, shared CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..backend import blas_threads
from ..core.sampling import Sampling
from ..core.speculative import Request, generate
from ..drafters import NoDrafter, default_exit_layer, make_drafter
from ..errors import MinispecError
from ..options import add_device, add_threads, check_num_prompts, check_positive
from ..shipped import SHIPPED, display
from . import harness
from .harness import per_token_alpha  # noqa: F401 - part of the sweep's public vocabulary

GAMMAS = tuple(range(1, 9))
CHAIN_DRAFTERS = ("model", "ngram", "early-exit")  # the theorem's prediction is for chains


def sweep(target, drafter: str, prompts: Sequence[list[int]], *, draft_model=None,
          exit_layer: int | None = None, gammas: Sequence[int] = GAMMAS,
          temperature: float = 0.0, max_new_tokens: int = 64, repeats: int = 1, seed: int = 0
          ) -> dict:
    """Measure autoregressive and speculative decoding side by side at each gamma.

    drafter: "model" (needs draft_model) | "ngram" | "early-exit"; prompts: token id lists.
    repeats: timed passes over the prompts (the median counts); generation stops at the
    target's EOS ids (harness.benchmark_eos). Returns a JSON-ready dict: settings,
    "autoregressive" (tokens/s), the step costs and c, one row per gamma
    (alpha, acceptance_rate, tokens_per_target_call, c, speedup, predicted_speedup, and
    predicted_speedup_measured_verify, the theorem with the verify call's measured cost), and
    "recommended_gamma", the fastest measured.
    """
    if not prompts:
        raise MinispecError("prompts: the sweep needs at least one prompt")
    if exit_layer is None and drafter == "early-exit":
        exit_layer = default_exit_layer(target)
    make_drafter(drafter, target, draft_model=draft_model, exit_layer=exit_layer)  # check early
    sampling = Sampling(temperature)
    request = Request(max_new_tokens, harness.benchmark_eos(target), seed)
    plain = NoDrafter(target)
    step = harness.draft_step_model(drafter, target, draft_model, exit_layer)
    context = harness.typical_context(prompts, max_new_tokens)  # where the costs are timed

    rows, ar_speeds, ar_tokens, steps = [], [], [], []
    for gamma in gammas:
        harness.progress(f"gamma {gamma} of {', '.join(map(str, gammas))}")
        # everything a row compares is measured together, gamma by gamma: on a shared machine
        # the load drifts over a sweep, and a ratio should compare times taken under one load
        d = make_drafter(drafter, target, draft_model=draft_model, exit_layer=exit_layer)
        methods = {
            "autoregressive": lambda p: generate(target, plain, p, sampling, request, gamma=0),
            "speculative": lambda p, d=d, g=gamma: generate(target, d, p, sampling, request,
                                                            gamma=g),
        }
        timed, costs = harness.time_speed_and_costs(methods, prompts, repeats, target, step,
                                                    gamma, context)
        ar, sp = timed["autoregressive"], timed["speculative"]
        ar_speeds.append(ar["tokens_per_second"])
        ar_tokens.append(ar["new_tokens"])
        steps.append(costs)
        results = sp["results"]
        calls = sum(r.stats.target_calls for r in results)
        if step is not None:
            c = costs["c"]
        else:  # n-gram: measured lookup seconds per round, spread over the gamma it may draft
            c = sum(r.stats.draft_seconds for r in results) / calls / gamma
            c /= costs["target_step_s"]
        alpha = sp["stats"]["alpha"]
        drafted = sp["stats"]["drafted"]
        rows.append({
            "gamma": gamma,
            "acceptance_rate": sp["stats"]["accepted"] / drafted if drafted else 0.0,
            "alpha": alpha,
            "tokens_per_target_call": sp["new_tokens"] / calls,
            "c": c,
            "seconds": sp["seconds"],
            "tokens_per_second": sp["tokens_per_second"],
            "autoregressive_tokens_per_second": ar["tokens_per_second"],
            "speedup": sp["tokens_per_second"] / ar["tokens_per_second"],
            "predicted_speedup": harness.predicted_speedup(alpha, gamma, c),
            "target_step_s": costs["target_step_s"],
            "draft_step_s": costs["draft_step_s"] if step is not None else None,
            "verify_ratio": costs["verify_ratio"],
            "predicted_speedup_measured_verify": harness.predicted_speedup_measured_verify(
                alpha, gamma, c, costs["verify_ratio"]),
            "identical_to_autoregressive": sum(
                a == b for a, b in zip(sp["outputs"], ar["outputs"])),
        })
    best = max(rows, key=lambda r: r["speedup"])
    return {
        "settings": {"drafter": drafter, "exit_layer": exit_layer if drafter == "early-exit"
                     else None, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
                     "temperature": temperature, "repeats": repeats, "seed": seed},
        "autoregressive": {"new_tokens": ar_tokens[0],
                           "tokens_per_second": harness.median(ar_speeds)},
        "target_step_s": harness.median([c["target_step_s"] for c in steps]),
        "draft_step_s": None if step is None else harness.median(
            [c["draft_step_s"] for c in steps]),
        "step_context": steps[0]["context"],
        "rows": rows,
        "recommended_gamma": best["gamma"],
    }


def format_table(report: dict) -> str:
    """The sweep as a table for people, with the recommendation under it."""
    s, ar, ms = report["settings"], report["autoregressive"], 1e3
    steps = f"target step {report['target_step_s'] * ms:.2f} ms"
    if report["draft_step_s"] is not None:
        steps += f", draft step {report['draft_step_s'] * ms:.2f} ms"
    header = (f"{'gamma':>5} {'accept':>7} {'alpha':>6} {'tok/call':>9} {'c':>7} "
              f"{'verify':>7} {'speedup':>8} {'predicted':>10} {'pred+v':>7}")
    first = (f"autoregressive: {ar['new_tokens']} tokens, {ar['tokens_per_second']:.1f} tok/s "
             f"(median of the runs beside each gamma); {steps} (one token, warm cache of "
             f"{report['step_context']} positions, timed in rounds as the loop runs them)")
    lines = [first, "", header]
    for r in report["rows"]:
        lines.append(f"{r['gamma']:>5} {r['acceptance_rate']:>7.3f} {r['alpha']:>6.3f} "
                     f"{r['tokens_per_target_call']:>9.2f} {r['c']:>7.4f} "
                     f"{r['verify_ratio']:>7.2f} {r['speedup']:>7.2f}x "
                     f"{r['predicted_speedup']:>9.2f}x "
                     f"{r['predicted_speedup_measured_verify']:>6.2f}x")
    best = next(r for r in report["rows"] if r["gamma"] == report["recommended_gamma"])
    lines.append("")
    lines.append(f"recommended gamma: {best['gamma']} (fastest measured: {best['speedup']:.2f}x "
                 f"over autoregressive; Theorem 3.8 predicted {best['predicted_speedup']:.2f}x)")
    if s["temperature"] == 0:
        same = [r["identical_to_autoregressive"] for r in report["rows"]]
        lines.append(f"greedy outputs identical to autoregressive: {s['prompts']}/{s['prompts']} "
                     f"prompts at every gamma" if min(same) == s["prompts"] else
                     f"WARNING: greedy outputs differ from autoregressive: {same}")
    lines.append("alpha = accepted / (accepted + rejections); accept = accepted / drafted; "
                 "predicted = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) (Theorem 3.8); "
                 "verify = t(gamma+1 tokens) / t(1 token) of one target call, measured; pred+v = "
                 "the theorem with that verify cost in place of 1")
    return "\n".join(lines)


def need_matplotlib(path: str | None) -> None:
    """MinispecError, before anything is measured, when --plot asks for a file that cannot be
    drawn: matplotlib is the `plot` extra (pip install "minispec[plot]")."""
    if path is not None and importlib.util.find_spec("matplotlib") is None:
        raise MinispecError(f"--plot {path}: needs matplotlib, which is not installed: "
                            "pip install 'minispec[plot]' (or pip install matplotlib); "
                            "nothing was measured")


def save(fig, path: str) -> str:
    """Write a figure (readable size: 100 dpi), or MinispecError naming --plot and why not."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as e:
        raise MinispecError(f"--plot {path}: cannot write ({e})") from None
    finally:
        plt.close(fig)
    return f"wrote {path}"


def plot(report: dict, path: str) -> str:
    """Measured and predicted speedup against gamma, written to `path` (needs matplotlib)."""
    need_matplotlib(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    gammas = [r["gamma"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(gammas, [r["speedup"] for r in rows], "o-", label="measured")
    ax.plot(gammas, [r["predicted_speedup"] for r in rows], "s--", label="Theorem 3.8")
    ax.plot(gammas, [r["predicted_speedup_measured_verify"] for r in rows], "^:",
            label="Theorem 3.8, measured verify cost")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("gamma (draft tokens per round)")
    ax.set_ylabel("speedup over autoregressive")
    s = report["settings"]
    ax.set_title(f"Speedup against gamma\n{s['drafter']} drafter, {s['prompts']} prompts x "
                 f"{s['max_new_tokens']} new tokens, temperature {s['temperature']:g}",
                 fontsize=11)
    ax.legend()
    fig.tight_layout()
    return save(fig, path)


def build_parser() -> argparse.ArgumentParser:
    """The `minispec sweep` command line."""
    ap = argparse.ArgumentParser(
        prog="minispec sweep",
        description="Speculative decoding at gamma = 1..8: measured speedup beside Theorem "
        "3.8's prediction from the measured alpha and c, and the best gamma.")
    ap.add_argument("--target", type=Path, default=None,
                    help="target directory (default: shipped:target)")
    ap.add_argument("--draft", type=Path, default=None,
                    help="draft directory for --drafter model (default: shipped:draft)")
    ap.add_argument("--prompts", type=Path, default=None,
                    help="prompt file, prompts.json format or one per line "
                    "(default: shipped:prompts.json)")
    ap.add_argument("--num-prompts", type=int, default=10, help="first N prompts (0 = all)")
    ap.add_argument("--drafter", choices=CHAIN_DRAFTERS, default="model",
                    help="a chain drafter (trees: minispec drafters)")
    ap.add_argument("--exit-layer", type=int, default=None,
                    help="layers the early-exit drafter runs (default: a quarter)")
    ap.add_argument("--gammas", default="1-8", help="gammas to try: 1-8 or a list 1,2,4 (at most "
                    f"{MAX_GAMMAS})")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per setting (median)")
    ap.add_argument("--seed", type=int, default=0)
    add_threads(ap)
    add_device(ap)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="draw measured and predicted speedup against gamma (needs the plot "
                    "extra: pip install 'minispec[plot]')")
    return ap


MAX_GAMMAS = 64  # values of one sweep: each is a full run over the prompts


def parse_gammas(text: str) -> list[int]:
    """'1-8' or '1,2,4' -> the list of gammas (each >= 1, at most MAX_GAMMAS of them)."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if hi - lo >= MAX_GAMMAS:
                raise MinispecError(f"--gammas: at most {MAX_GAMMAS} values (each a run over "
                                    f"the prompts), got {text!r}")
            gammas = list(range(lo, hi + 1))
        else:
            gammas = [int(x) for x in text.split(",")]
    except ValueError:
        gammas = []
    if len(gammas) > MAX_GAMMAS:
        raise MinispecError(f"--gammas: at most {MAX_GAMMAS} values (each a run over the "
                            f"prompts), got {len(gammas)}")
    if not gammas or min(gammas) < 1:
        raise MinispecError(f"--gammas: expected a range like 1-8 or a list like 1,2,4 of "
                            f"integers >= 1, got {text!r}")
    return gammas


def _paths(args) -> tuple[Path, Path | None, Path]:
    """target, draft (None unless the model drafter) and prompt paths; MinispecError naming the
    flag to pass when a default from weights/ is not there."""
    def pick(given: Path | None, default: Path, flag: str) -> Path:
        path = given if given is not None else default
        if not path.exists():
            hint = "" if given is not None else f" (the default; weights/ has no {default.name})"
            raise MinispecError(f"{flag}: {path} does not exist{hint}; pass {flag} PATH")
        return path

    target = pick(args.target, SHIPPED / "target", "--target")
    draft = pick(args.draft, SHIPPED / "draft", "--draft") if args.drafter == "model" else None
    return target, draft, pick(args.prompts, SHIPPED / "prompts.json", "--prompts")


def blas_control() -> str:
    """How the BLAS thread count is set: threadpoolctl if installed, else OpenBLAS via ctypes."""
    if importlib.util.find_spec("threadpoolctl") is not None:
        return "threadpoolctl"
    return "OpenBLAS through ctypes"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep from the command line; 0 on success (errors: MinispecError, to the CLI)."""
    args = build_parser().parse_args(argv)
    from ..loader import load

    gammas = parse_gammas(args.gammas)
    check_positive(args, "repeats", "max_new_tokens")
    check_num_prompts(args)
    need_matplotlib(args.plot)  # before a long measurement, not after it
    target_dir, draft_dir, prompt_file = _paths(args)
    start = time.perf_counter()
    with blas_threads(args.threads) as threads:
        target = load(target_dir, device=args.device)
        draft = load(draft_dir, device=args.device) if draft_dir is not None else None
        texts = harness.load_prompts(prompt_file, args.num_prompts or None)
        prompts = harness.encode_prompts(texts, target.tokenizer)
        harness.check_room(target, prompts, args.max_new_tokens, gammas, display(prompt_file),
                           "--gammas")
        report = sweep(target, args.drafter, prompts, draft_model=draft,
                       exit_layer=args.exit_layer, gammas=gammas,
                       temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                       repeats=args.repeats, seed=args.seed)
    report["settings"].update(target=str(target_dir), draft=None if draft_dir is None
                              else str(draft_dir), prompt_file=str(prompt_file),
                              device=target.device,
                              blas_threads=threads, blas_control=blas_control(),
                              seconds=time.perf_counter() - start)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        s = report["settings"]
        drafter = {"model": f"model ({display(draft_dir)})",
                   "ngram": "ngram (prompt lookup, max_n 3)",
                   "early-exit": f"early-exit (first {s['exit_layer']} of "
                   f"{target.n_layers} layers)"}[args.drafter]
        blas = (f"{threads} ({s['blas_control']})" if threads is not None
                else "unknown (the BLAS could not be controlled)")
        print(f"minispec sweep: target {display(target_dir)}, drafter {drafter}, "
              f"{len(prompts)} prompts from {display(prompt_file)}, {args.max_new_tokens} new "
              f"tokens, temperature {args.temperature}, {target.device}, BLAS threads {blas}")
        print(format_table(report))
        print(f"({s['seconds']:.1f} s)")
    if args.plot:  # after --json, the note goes to stderr: stdout stays valid JSON
        print(plot(report, args.plot), file=sys.stderr if args.json else sys.stdout)
    return 0
