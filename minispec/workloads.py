"""Workloads: prompt sets written for minispec, one per kind of task, for the real model.

Acceptance depends on the text (Leviathan et al. 2023, section 4: alpha differs by task): a
drafter that copies wins where the answer repeats its prompt, one that guesses new text where
it does not. `minispec real bench --workload NAME` and `real drafters --workload NAME` run a set:

    grounded  answers copied or extracted from a text given in the prompt (lists, quotes, fields,
              reformatting)
    code      completion of a Python stub
    chat      open questions: nothing to copy
    edit      rewrite a given snippet (type hints, tense, spelling, renaming, tone)

Each is weights/workloads/NAME.json: "prompts", the benchmark's 8, and "tune", 4 held out on
which the drafters' knobs were chosen (`python -m minispec.workloads tune`); with "chat": true
each text is a user turn, wrapped in ChatML (SmolLM2-Instruct's chat format, without the
default system prompt its template adds). None of them comes from the heads' training text
(weights/train_heads.py).

    python -m minispec.workloads tune --workloads grounded,code --split tune
        tokens per target call of each candidate drafter and knob (exact at T = 0) and the
        speedup they predict from the target call's measured cost by rows (see `predict`)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .core.speculative import DEFAULT_GAMMA
from .errors import MinispecError
from .shipped import SHIPPED, default_cache

WORKLOADS = ("grounded", "code", "chat", "edit")
SPLITS = ("prompts", "tune")  # the benchmark's prompts, and those held out for tuning

# ChatML, SmolLM2-Instruct's chat format (its tokenizer_config.json's chat_template, less the
# default system prompt the template adds)
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def workload_file(name: str) -> Path:
    """weights/workloads/NAME.json (or the copy a wheel installs)."""
    if name not in WORKLOADS:
        raise MinispecError(f"--workload: expected one of {', '.join(WORKLOADS)} or all, got "
                            f"{name!r:.60}")
    return SHIPPED / "workloads" / f"{name}.json"


def workload_names(text: str) -> list[str]:
    """--workload's value: one name, several comma-separated, or "all" -> the names."""
    names = list(WORKLOADS) if text == "all" else [n.strip() for n in text.split(",")]
    for n in names:
        workload_file(n)  # checks the name
    return names


def load_workload(name: str, split: str = "prompts") -> list[str]:
    """The prompt texts of workload `name` (its benchmark prompts, or split "tune": the held-out
    ones), each wrapped as a chat turn where the set is one."""
    path = workload_file(name)
    if split not in SPLITS:
        raise MinispecError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        texts = [item["text"] for item in data[split]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MinispecError(f"{path}: not a workload file ({type(e).__name__}: {e})") from None
    return [CHAT.format(t) for t in texts] if data.get("chat") else texts


def write_prompts(name: str, folder: Path, split: str = "prompts") -> Path:
    """Workload `name` as a prompts.json in `folder` (the format of `--prompts FILE`)."""
    path = Path(folder) / f"{name}.json"
    path.write_text(json.dumps({"prompts": [{"text": t} for t in load_workload(name, split)]},
                               indent=1) + "\n", encoding="utf-8")
    return path


# ---- the table of `--workload all` --------------------------------------------------------------


def by_workload(reports: dict[str, dict], temperature: str | None = None
                ) -> dict[str, dict[str, dict]]:
    """{method: {workload: {"tokens_per_target_call", "speedup", "decode_speedup",
    "identical"}}} from the reports of `bench --draft none` (run_without_draft) or `drafters`
    (its rows at `temperature`, e.g. "0"; default the first; no decode_speedup), one per
    workload."""
    table: dict[str, dict[str, dict]] = {}
    for w, report in reports.items():
        if "generation" in report:  # bench
            agree = report.get("greedy_agreement", {})
            for name, row in report["generation"].items():
                a = agree.get(f"{name} vs minispec autoregressive")
                table.setdefault(name, {})[w] = {
                    "tokens_per_target_call": row["tokens_per_target_call"],
                    "speedup": row["speedup"], "decode_speedup": row.get("decode_speedup"),
                    "identical": None if a is None else a["identical"] == a["total"]}
        else:  # drafters
            by_t = report["by_temperature"]
            rows = by_t[temperature] if temperature is not None else next(iter(by_t.values()))
            for row in rows:
                table.setdefault(row["method"], {})[w] = {
                    "tokens_per_target_call": row["tokens_per_target_call"],
                    "speedup": row["speedup"], "decode_speedup": None,
                    "identical": row["identical"]}
    return table


def format_by_workload(table: dict[str, dict[str, dict]], header: list[str]) -> str:
    """The table: one row per method, per workload its tokens per target call and speedup over
    autoregressive decoding, end to end and (where measured) in the decode phase, after each
    prompt's first round, which holds its prefill (and "!" where a greedy output differed)."""
    workloads = list(dict.fromkeys(w for row in table.values() for w in row))
    width = max([28, *(len(m) + 2 for m in table)])
    lines = list(header) + ["", "tokens per target call / speedup over autoregressive decoding,"
                            " end to end / in the decode phase (after each prompt's first round,"
                            " which holds its prefill); each workload timed in its own run,"
                            " methods interleaved",
                            f"{'method':<{width}}" + "".join(f"{w:>22}" for w in workloads)]
    for method, row in table.items():
        cells = []
        for w in workloads:
            c = row.get(w)
            if c is None:
                cells.append(f"{'':>22}")
                continue
            tpc, decode = c["tokens_per_target_call"], c.get("decode_speedup")
            mark = "!" if c["identical"] is False else " "
            cells.append(f"{'-' if tpc is None else f'{tpc:.2f}':>7} {c['speedup']:5.2f}x "
                         f"{'-' if decode is None else f'{decode:.2f}x':>6}{mark}")
        lines.append(f"{method:<{width}}" + "".join(cells))
    checked = [c["identical"] for row in table.values() for c in row.values()
               if c["identical"] is not None]
    if False in checked:
        lines.append("! a greedy output differed from autoregressive decoding's")
    elif checked:
        lines.append("greedy outputs: every method's identical to autoregressive decoding's, "
                     "token for token, on every prompt")
    return "\n".join(lines)


def plot_by_workload(table: dict[str, dict[str, dict]], path: str, title: str) -> str:
    """Tokens per target call by workload (groups) and drafter (bars), written to `path`; a note
    instead if matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot: matplotlib is not installed, {path} not written"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = {m: r for m, r in table.items()
            if any(c["tokens_per_target_call"] is not None for c in r.values())
            and "autoregressive" not in m}
    workloads = list(dict.fromkeys(w for r in table.values() for w in r))
    fig, ax = plt.subplots(figsize=(8.0, 4.4))
    width = 0.8 / max(len(rows), 1)
    x = np.arange(len(workloads))
    for i, (method, row) in enumerate(rows.items()):
        ys = [row.get(w, {}).get("tokens_per_target_call") or 0.0 for w in workloads]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, ys, width,
               label=method.removeprefix("minispec "))
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(x, workloads)
    ax.set_ylabel("tokens per target call")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


# ---- tuning: tokens per call, and the speedup the target call's cost predicts --------------------


def rows_fed(prompt_len: int, result) -> list[int]:
    """The rows of each target call of a generation: the prompt and the first drafts, then one
    context token and each round's drafts."""
    return [len(rd.drafted) + (1 if i else prompt_len)
            for i, rd in enumerate(result.stats.rounds)]


def call_costs(target, rows, context: int, repeats: int = 5) -> dict[int, float]:
    """{k: median seconds of a target call of k rows} for each k in `rows`, timed round-robin
    (harness.time_decode_steps): a few rows on a cache of `context` positions, a prompt's
    prefill (k > 32) on an almost empty one."""
    from .measure.harness import time_decode_steps

    ks = sorted(set(rows))
    times = time_decode_steps([(target, k) for k in ks if k <= 32], context, repeats)
    times += time_decode_steps([(target, k) for k in ks if k > 32], 1, max(repeats // 2, 1))
    return dict(zip(ks, times))


def predict(prompt_lens: list[int], results, costs: dict[int, float], overhead_s: float
            ) -> float:
    """Seconds a set of generations would take if each round cost a target call of its rows
    (`costs`) plus `overhead_s` (warping, verification, the loop's bookkeeping), plus the
    drafting time measured in it. At T = 0 the rounds are exact, so this ranks knobs without
    most of the noise of a shared machine; the benchmark then times the winners."""
    total = 0.0
    for n, r in zip(prompt_lens, results):
        total += sum(costs[k] + overhead_s for k in rows_fed(n, r)) + r.stats.draft_seconds
    return total


# knobs tried by `tune` (NAME:key=value,...; gamma is the loop's, the rest make_drafter's or
# AutoDrafter's): how long a lookup's copy may be (ngram's gamma; auto's first and shortest copy,
# its gamma), the shortest match that starts a copy (eagle's copy, auto's lookup), whether auto
# copies where the places it could copy from disagree (agree=0), how long a head's chain may be
# (eagle's stop and gamma; auto's chain), and gamma
CANDIDATES = (
    "ngram:gamma=4", "ngram:gamma=8",
    "eagle:stop=0.15,gamma=4", "eagle:stop=0.15,gamma=6", "eagle:stop=0.15,copy=1,gamma=4",
    "eagle:stop=0.15,copy=2,gamma=4", "eagle:stop=0.15,copy=2,gamma=8",
    "eagle:stop=0.3,copy=2,gamma=8",
    "auto:lookup=2,chain=2,gamma=16", "auto:lookup=2,chain=3,gamma=16",
    "auto:lookup=2,chain=4,gamma=16", "auto:lookup=2,chain=6,gamma=16",
    "auto:lookup=2,agree=0,gamma=16",
    "auto:lookup=1,gamma=16", "auto:lookup=2,gamma=16", "auto:lookup=3,gamma=16",
    "auto:lookup=2,gamma=8", "auto:lookup=2,first=4,gamma=16", "auto:lookup=2,first=16,gamma=16",
    "auto:lookup=2,shortest=2,gamma=16", "auto:lookup=2,shortest=8,gamma=16",
)


def make_candidate(spec: str, target):
    """"NAME:key=value,..." -> (drafter, gamma)."""
    from .drafters import make_drafter

    name, _, rest = spec.partition(":")
    kw: dict = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        try:
            kw[key] = float(value) if key == "stop" else int(value)
        except ValueError:
            raise MinispecError(f"--candidates: {spec!r}: {item!r} is no key=number") from None
    gamma = kw.pop("gamma", DEFAULT_GAMMA)
    extra = {k: kw.pop(k) for k in ("first", "shortest", "max_n", "chain", "agree") if k in kw}
    try:
        drafter = make_drafter(name, target, **kw)
    except TypeError as e:
        raise MinispecError(f"--candidates: {spec!r}: {e}") from None
    for k, v in extra.items():
        if not hasattr(drafter, k):
            raise MinispecError(f"--candidates: {spec!r}: drafter {name} has no {k}")
        if v < (0 if k == "agree" else 1) or (k == "agree" and v > 1):
            want = "0 or 1" if k == "agree" else "an integer >= 1"
            raise MinispecError(f"--candidates: {spec!r}: {k} must be {want}, got {v}")
        setattr(drafter, k, v)
    if getattr(drafter, "max_n", 1) < getattr(drafter, "min_n", 1):
        raise MinispecError(f"--candidates: {spec!r}: max_n must be >= the lookup's "
                            f"{drafter.min_n} tokens")
    return drafter, gamma


def tune(target, workloads, split: str, candidates, temperature: float = 0.0,
         max_new_tokens: int = 64, repeats: int = 5) -> dict:
    """{"costs", "overhead_s", "overhead_measured_s", "workloads": {workload: {candidate:
    {"tokens_per_target_call", "predicted_speedup", "identical"}}}} on the prompts of `split`:
    every candidate's generations, then the target call of every row count they used, timed
    (median of `repeats`), then `predict`; overhead_s is the loop's own time per round (an
    autoregressive round less the one-row call), overhead_measured_s that difference before it
    is counted as 0 where noise made it negative."""
    from .core.drafter import NoDrafter
    from .core.sampling import Sampling
    from .core.speculative import Request, generate
    from .measure.harness import benchmark_eos, median

    request, sampling = Request(max_new_tokens, benchmark_eos(target), 0), Sampling(temperature)
    prompts = {w: [target.tokenizer.encode(t) for t in load_workload(w, split)]
               for w in workloads}
    # a short generation of each first, on one prompt: the drafting time `predict` charges
    # is then its own, not numba's compiling of the loops a drafter is the first to call
    warm = Request(min(8, max_new_tokens), request.eos_token_ids, 0)
    first = prompts[workloads[0]][0]
    generate(target, NoDrafter(target), first, sampling, warm, gamma=0)
    for spec in candidates:
        drafter, gamma = make_candidate(spec, target)
        generate(target, drafter, first, sampling, warm, gamma=gamma)
    runs: dict = {}
    for w, ps in prompts.items():
        runs[w] = {"autoregressive": [generate(target, NoDrafter(target), p, sampling, request,
                                               gamma=0) for p in ps]}
        for spec in candidates:
            drafter, gamma = make_candidate(spec, target)
            runs[w][spec] = [generate(target, drafter, p, sampling, request, gamma=gamma)
                             for p in ps]
    rows = [k for w, ps in prompts.items() for res in runs[w].values()
            for p, r in zip(ps, res) for k in rows_fed(len(p), r)]
    lens = [len(p) for ps in prompts.values() for p in ps]
    costs = call_costs(target, rows, sum(lens) // len(lens) + max_new_tokens // 2, repeats)
    # the loop's own time per round: an autoregressive round less its one-row target call
    plain = [rd.verify_seconds for w in prompts for r in runs[w]["autoregressive"]
             for rd in r.stats.rounds[1:]]
    measured = median(plain) - costs[1]  # the two are timed apart: noise can make it < 0
    overhead = max(measured, 0.0)
    out: dict = {"costs": costs, "overhead_s": overhead, "overhead_measured_s": measured,
                 "workloads": {}}
    for w, ps in prompts.items():
        lens = [len(p) for p in ps]
        base = runs[w]["autoregressive"]
        t0 = predict(lens, base, costs, overhead)
        out["workloads"][w] = {}
        for spec in candidates:
            res = runs[w][spec]
            new = sum(r.stats.new_tokens for r in res)
            calls = sum(r.stats.target_calls for r in res)
            out["workloads"][w][spec] = {
                "tokens_per_target_call": new / calls,
                "predicted_speedup": t0 / predict(lens, res, costs, overhead),
                "identical": ([r.tokens for r in res] == [r.tokens for r in base]
                              if temperature == 0 else None)}
    return out


def _converted_smollm2() -> Path:
    """Where `minispec real` keeps SmolLM2 converted (shipped.default_cache): MinispecError if
    it has not run yet (real.py, which converts, imports this module, not the other way)."""
    path = default_cache()
    if not (path / "config.json").is_file():
        raise MinispecError(f"{path}: no converted SmolLM2 there; run `python -m minispec real "
                            "demo` once (it converts it), or pass --model DIR")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m minispec.workloads tune`: the knobs of CANDIDATES on held-out prompts."""
    from .backend import blas_threads
    from .cpu_steps import enable_where_supported
    from .loader import load
    from .measure.harness import check_room
    from .options import check_positive

    ap = argparse.ArgumentParser(prog="python -m minispec.workloads", description="Tune the "
                                 "drafters on the workloads' held-out prompts: tokens per target "
                                 "call of each candidate and the speedup the target call's "
                                 "measured cost by rows predicts.")
    ap.add_argument("command", choices=["tune"])
    ap.add_argument("--model", default=None, help="a Hugging Face directory (default: SmolLM2 "
                    "as minispec real converts it)")
    ap.add_argument("--workloads", default="all", help="names, comma-separated, or all")
    ap.add_argument("--split", choices=SPLITS, default="tune")
    ap.add_argument("--candidates", default=";".join(CANDIDATES),
                    help="NAME:key=value,... separated by ';' (default: CANDIDATES)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads")
    args = ap.parse_args(argv)
    try:
        names = workload_names(args.workloads)
        target = load(args.model or _converted_smollm2())
        enable_where_supported(target)  # the path the benchmarks time: its costs, its calls
        gammas = [make_candidate(spec, target)[1]  # every candidate checked before any run
                  for spec in args.candidates.split(";")]
        check_positive(args, "max_new_tokens")
        prompts = [target.tokenizer.encode(t) for w in names for t in load_workload(w, args.split)]
        check_room(target, prompts, args.max_new_tokens, gammas, f"--workloads {args.workloads}")
        with blas_threads(args.threads):
            out = tune(target, names, args.split, args.candidates.split(";"),
                       args.temperature, args.max_new_tokens)
    except MinispecError as e:
        print(f"minispec.workloads: error: {e}", file=sys.stderr)
        return 2
    c = out["costs"]
    print(f"tuning on the {args.split!r} prompts, T = {args.temperature:g}, "
          f"{args.max_new_tokens} new tokens, BLAS threads {args.threads}")
    print(f"target call of k rows / one row ({c[1] * 1e3:.1f} ms): " + " ".join(
        f"{k}:{c[k] / c[1]:.2f}" for k in (2, 3, 5, 9, 13, 17) if k in c)
        + "; the loop's own time per round " + (
            f"{out['overhead_s'] * 1e3:.1f} ms" if out["overhead_measured_s"] >= 0 else
            f"counted as 0 (an autoregressive round took {-out['overhead_measured_s'] * 1e3:.1f}"
            " ms less than the one-row call timed apart: this machine's noise)"))
    width = max(len(s) for s in args.candidates.split(";")) + 2
    print(f"\n{'candidate':<{width}}" + "".join(f"{w:>16}" for w in names))
    for spec in args.candidates.split(";"):
        cells = []
        for w in names:
            r = out["workloads"][w][spec]
            mark = "!" if r["identical"] is False else " "
            cells.append(f"{r['tokens_per_target_call']:7.2f} {r['predicted_speedup']:5.2f}x"
                         f"{mark}")
        print(f"{spec:<{width}}" + "".join(cells))
    print("\ntokens per target call (exact at T = 0) and the predicted speedup over "
          "autoregressive decoding; ! = a greedy output differed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
