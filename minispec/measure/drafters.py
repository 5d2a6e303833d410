"""`minispec drafters`: every drafter side by side on the held-out prompts, in one run.

    minispec drafters                               # T = 0 and T = 1, the shipped models
    minispec drafters --temperatures 0 --num-prompts 20 --json

For each temperature every method decodes the same prompts, methods interleaved pass by pass
(harness.time_methods, the one timing harness), after a warm-up: autoregressive decoding, then
each drafter of DRAFTER_ROWS. Per method: tokens per target call, drafts accepted per round,
the cost of a round (draft + verify seconds per target call), tokens per second and the speedup
over autoregressive decoding; at T = 0, whether the output is autoregressive decoding's, token
for token. Then the tree's price: one target call over a tree of n nodes (tree attention mask)
against one over a chain of the same depth, and against a one-token step.

Adding a drafter to the table is one line in DRAFTER_ROWS. `--drafters ngram,early-exit` keeps
the rows of those drafters (the first word of a row's label), `--draft none` runs without a draft
model (its rows are left out, and the output says so): what a target with no draft model and no
trained heads can run (`minispec real drafters`, minispec/real.py). The tree's price is measured
when a tree drafter is in the table. On the GPU with CUDA graphs the table adds DEVICE_ROWS: the
draft model's and EAGLE's chains with every round on the device (minispec/device_rounds.py),
and autoregressive decoding played the same way; their speedups are over the loop's
autoregressive decoding like every row's (the device baseline's own row shows what it gains).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ..backend import blas_threads
from ..core.sampling import Sampling
from ..core.speculative import DEFAULT_GAMMA, Request, generate
from ..device_rounds import DeviceRounds
from ..drafters import (
    AUTO_GAMMA,
    EAGLE_COPY,
    EAGLE_STOP,
    MODEL_STOP,
    PRESET_GAMMA,
    NoDrafter,
    head_draft_vocab,
    make_drafter,
)
from ..drafters.tree_model import tree_size
from ..errors import MinispecError
from ..options import (
    add_activations,
    add_device,
    add_dtype,
    add_fast_steps,
    add_gamma,
    add_threads,
    check_activations,
    check_positive,
    parse_gamma,
)
from ..shipped import models_hint, path_arg
from ..tree import hidden_tree
from . import harness

# (label, make(target, draft model) -> drafter): one line per drafter
DRAFTER_ROWS = [
    ("model (chain)", lambda t, d: make_drafter("model", t, draft_model=d)),
    # the same chain without the target's greedy vocabulary (drafters/vocab.py): what it buys
    ("model (whole head)", lambda t, d: make_drafter("model", t, draft_model=d,
                                                     greedy_vocab=None)),
    (f"model stop {MODEL_STOP:g}", lambda t, d: make_drafter(
        "model", t, draft_model=d, stop=MODEL_STOP, draft_vocab=head_draft_vocab(t))),
    ("model-tree 2,2,1,1", lambda t, d: make_drafter("model-tree", t, draft_model=d)),
    ("model-tree 3,2,1,1", lambda t, d: make_drafter("model-tree", t, draft_model=d,
                                                     tree=(3, 2, 1, 1))),
    ("ngram", lambda t, d: make_drafter("ngram", t)),
    ("early-exit", lambda t, d: make_drafter("early-exit", t)),
    ("medusa 1,1,1,1", lambda t, d: make_drafter("medusa", t, tree=(1, 1, 1, 1))),
    ("medusa 2,2,1,1", lambda t, d: make_drafter("medusa", t, tree=(2, 2, 1, 1))),
    ("medusa 3,2,1,1", lambda t, d: make_drafter("medusa", t, tree=(3, 2, 1, 1))),
    ("medusa 3,3,1,1", lambda t, d: make_drafter("medusa", t, tree=(3, 3, 1, 1))),
    ("eagle (chain)", lambda t, d: make_drafter("eagle", t)),
    (f"eagle stop {EAGLE_STOP:g}", lambda t, d: make_drafter("eagle", t, stop=EAGLE_STOP)),
    (f"eagle stop+copy {EAGLE_COPY}", lambda t, d: make_drafter("eagle", t, stop=EAGLE_STOP,
                                                                copy=EAGLE_COPY)),
    ("eagle 2,2,1,1", lambda t, d: make_drafter("eagle", t, tree=(2, 2, 1, 1))),
    ("eagle-2 4,3,2,2 b3 n12", lambda t, d: make_drafter("eagle", t, tree=(4, 3, 2, 2),
                                                          dynamic=(3, 12))),
    (f"auto (gamma {AUTO_GAMMA})", lambda t, d: make_drafter("auto", t)),
]
# whole rounds on the device (minispec/device_rounds.py), for a GPU: (label, make(target, draft
# model, gamma) -> DeviceRounds); autoregressive decoding played the same way is their baseline
DEVICE_ROWS = [
    ("autoregressive (device)", lambda t, d, g: DeviceRounds(t, None)),
    ("model (device)", lambda t, d, g: DeviceRounds(t, d, gamma=g)),
    ("eagle (device)", lambda t, d, g: DeviceRounds(t, make_drafter("eagle", t), gamma=g)),
]
NEEDS_DRAFT_MODEL = ("model", "model-tree")  # a row's drafter: the first word of its label
TREES = ("model-tree", "medusa", "eagle", "eagle-2")  # rows that can draft trees
TREE_SHAPES = [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1), (3, 2, 1, 1), (3, 3, 2, 1)]


def side_by_side(target, draft, prompts, *, temperature: float, gamma: int = DEFAULT_GAMMA,
                 max_new_tokens: int = 64, repeats: int = 1, seed: int = 0,
                 rows=DRAFTER_ROWS, device_rows=()) -> list[dict]:
    """One dict per method (autoregressive first) for one temperature; device_rows: rows of
    DEVICE_ROWS too."""
    sampling = Sampling(temperature)
    request = Request(max_new_tokens, harness.benchmark_eos(target), seed)
    drafters = {"autoregressive": NoDrafter(target)}
    drafters.update((label, make(target, draft)) for label, make in rows)
    drafters.update((label, make(target, draft, gamma)) for label, make in device_rows)

    def method(drafter, g):
        if isinstance(drafter, DeviceRounds):
            return lambda ids: drafter.generate(ids, sampling, request)
        return lambda ids: generate(target, drafter, ids, sampling, request, gamma=g)

    # a preset tuned with a gamma of its own (auto) runs at it
    methods = {name: method(d, 0 if name == "autoregressive" else
                            PRESET_GAMMA.get(name.split()[0], gamma))
               for name, d in drafters.items()}
    timed = harness.time_methods(methods, prompts, repeats)
    base = timed["autoregressive"]
    out = []
    for name, m in timed.items():
        st = m["stats"]
        rounds = [rd for r in m["results"] for rd in r.stats.rounds]
        out.append({
            "method": name, "tokens_per_second": m["tokens_per_second"],
            "speedup": m["tokens_per_second"] / base["tokens_per_second"],
            "tokens_per_target_call": st["new_tokens"] / st["target_calls"],
            "accepted_per_round": float(np.mean([rd.accepted for rd in rounds])),
            "drafted_per_round": float(np.mean([len(rd.drafted) for rd in rounds])),
            "ms_per_round": 1e3 * (st["draft_seconds"] + st["verify_seconds"])
            / st["target_calls"],
            "identical": m["outputs"] == base["outputs"] if temperature == 0 else None})
    return out


def select_rows(names: str | None, draft_model: bool, rows=DRAFTER_ROWS
                ) -> tuple[list, list[str]]:
    """The rows of the drafters in `names` (comma-separated drafter names; None: all), less those
    needing a draft model when there is none; and a note for each row left out that way."""
    wanted = None if names is None else [n.strip() for n in names.split(",") if n.strip()]
    known = {label.split()[0] for label, _ in rows}
    for n in wanted or []:
        if n not in known:
            raise MinispecError(f"--drafters: {n!r} is none of {', '.join(sorted(known))}")
    kept, notes = [], []
    for label, make in rows:
        name = label.split()[0]
        if wanted is not None and name not in wanted:
            continue
        if name in NEEDS_DRAFT_MODEL and not draft_model:
            notes.append(f"{label}: left out (--draft none: no draft model)")
            continue
        kept.append((label, make))
    if not kept:
        raise MinispecError("--drafters: no drafter left to run" + (
            " (--draft none leaves out model and model-tree)" if notes else ""))
    return kept, notes


def tree_costs(target, shapes=TREE_SHAPES, context: int = 64, repeats: int = 20) -> list[dict]:
    """Seconds of one target call over a tree of each shape (plus the last context token),
    over a chain of the same depth, and over one token, on a cache of `context` positions."""
    ids = (np.arange(context) % min(target.vocab_size, 256)).tolist()

    def tree_of(shape):
        parents, frontier = [], [-1]
        for k in shape:
            nxt = []
            for node in frontier:
                for _ in range(k):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            frontier = nxt
        return np.array(parents)

    trees = {shape: tree_of(shape) for shape in shapes}
    chains = {len(s): np.arange(len(s)) - 1 for s in shapes}
    cases = [("one token", np.array([], dtype=np.int64))]
    cases += [(f"chain {d}", p) for d, p in chains.items()]
    cases += [(",".join(map(str, s)), p) for s, p in trees.items()]
    cache = target.new_cache(context + 1 + max(len(p) for _, p in cases))
    target.hidden_states(ids[:-1], cache)
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for i in range(repeats + 2):  # round-robin, the first two passes untimed
        for name, parents in cases:
            t0 = time.perf_counter()
            h = hidden_tree(target, ids[-1:], np.full(len(parents), 5), parents, cache)
            target.lm_head(h)
            harness._sync(target)  # (on the GPU: the call's work, not only its launches)
            cache.rollback(context - 1)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    t1 = harness.median(times["one token"])
    out = []
    for s in shapes:
        name = ",".join(map(str, s))
        t_tree, t_chain = harness.median(times[name]), harness.median(times[f"chain {len(s)}"])
        out.append({"shape": name, "nodes": tree_size(s), "depth": len(s), "one_token_s": t1,
                    "tree_over_one_token": t_tree / t1, "chain_over_one_token": t_chain / t1,
                    "tree_over_chain": t_tree / t_chain})
    return out


def format_report(report: dict) -> str:
    s = report["settings"]
    where = ""
    if s.get("device", "cpu") != "cpu":
        graphs = " with CUDA graphs" if s["cuda_graphs"] else ""
        where = f", on the {s['device'].upper()}{graphs}"
    elif not s.get("fast_steps", True):
        where = ", model.py's plain path (--fast-steps off)"
    if s.get("dtype", "float32") != "float32":
        where += f", in {s['dtype']}"
    lines = [f"every drafter on {s['prompts']} held-out prompts x {s['max_new_tokens']} new "
             f"tokens, gamma (tree depth) {s['gamma']}, {s['repeats']} timed pass(es), "
             f"methods interleaved{where}"]
    for temp, rows in report["by_temperature"].items():
        lines.append(f"\nT = {temp}")
        w = max([20, *(len(r["method"]) for r in rows)])  # "eagle-2 4,3,2,2 b3 n12" is 22
        lines.append(f"{'method':<{w}} {'tok/call':>8} {'acc/rnd':>8} {'nodes':>6} "
                     f"{'ms/rnd':>7} {'tok/s':>7} {'speedup':>8}" + ("  identical"
                                                                    if temp == "0" else ""))
        for r in rows:
            ident = ("" if r["identical"] is None
                     else "  yes" if r["identical"] else "  NO")
            lines.append(f"{r['method']:<{w}} {r['tokens_per_target_call']:>8.2f} "
                         f"{r['accepted_per_round']:>8.2f} {r['drafted_per_round']:>6.1f} "
                         f"{r['ms_per_round']:>7.2f} {r['tokens_per_second']:>7.1f} "
                         f"{r['speedup']:>7.2f}x{ident}")
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    if not report["tree_costs"]:
        return "\n".join(lines)
    lines.append("\nthe tree's price: one target call over n nodes (+ the last context token), "
                 "over one token and over a chain of the same depth")
    lines.append(f"{'shape':<10} {'nodes':>5} {'tree/1':>7} {'chain/1':>8} {'tree/chain':>10}")
    for r in report["tree_costs"]:
        lines.append(f"{r['shape']:<10} {r['nodes']:>5} {r['tree_over_one_token']:>7.2f} "
                     f"{r['chain_over_one_token']:>8.2f} {r['tree_over_chain']:>10.2f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The `minispec drafters` command line (`minispec real drafters` reuses it with its own
    defaults and --workload)."""
    ap = argparse.ArgumentParser(
        prog="minispec drafters", description="Every drafter side by side on the held-out "
        "prompts: tokens per target call, cost per round, speedup; a tree's verify cost.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", type=path_arg, default="shipped:target",
                    help="target directory")
    ap.add_argument("--draft", default="shipped:draft",
                    help="draft directory, or 'none' (the rows needing a draft model left out)")
    ap.add_argument("--drafters", default=None, metavar="NAME,...",
                    help="only these drafters' rows, e.g. ngram,early-exit (default: all)")
    ap.add_argument("--prompts", type=path_arg, default="shipped:prompts.json",
                    help="prompt file, prompts.json format or one prompt per line")
    ap.add_argument("--num-prompts", type=int, default=10, help="prompts used")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt")
    add_gamma(ap, auto=False, what="chain length / tree depth")
    ap.add_argument("--temperatures", default="0,1", help="comma-separated temperatures")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes (median)")
    add_threads(ap)
    add_device(ap)
    add_dtype(ap)
    add_activations(ap)
    add_fast_steps(ap)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


def parse_temperatures(text: str) -> list[float]:
    """--temperatures: comma-separated numbers."""
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise MinispecError(f"--temperatures: expected numbers like 0,1, got {text!r}") from None


def device_rows(rows) -> list:
    """The DEVICE_ROWS of the drafters among `rows` (select_rows' choice), with their baseline:
    on the GPU with CUDA graphs, each drafter that has a device round runs both ways."""
    names = {label.split()[0] for label, _ in rows}
    kept = [row for row in DEVICE_ROWS[1:] if row[0].split()[0] in names]
    return DEVICE_ROWS[:1] + kept if kept else []


def run(args: argparse.Namespace) -> dict:
    """The table described by parsed `args` (gamma parsed), as a JSON-ready dict."""
    from ..cpu_steps import enable_where_supported
    from ..cuda_graphs import StepGraphs
    from ..loader import load

    temps = parse_temperatures(args.temperatures)
    check_positive(args, "repeats", "max_new_tokens")
    with blas_threads(args.threads):
        no_draft = args.draft.lower() == "none"
        rows, notes = select_rows(args.drafters, not no_draft)
        check_activations(args)
        target = load(args.target, device=args.device, dtype=args.dtype,
                      activations=args.activations)
        draft = None if no_draft else load(path_arg(args.draft), device=args.device,
                                           dtype=args.dtype)
        if args.fast_steps == "on":
            enable_where_supported(target, draft)
        texts = harness.load_prompts(args.prompts, args.num_prompts)
        prompts = harness.encode_prompts(texts, target.tokenizer)
        steps = getattr(target, "fast_steps", None)
        on_device = device_rows(rows) if isinstance(steps, StepGraphs) else []
        return {"settings": {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                             "gamma": args.gamma, "repeats": args.repeats,
                             "device": target.device, "dtype": str(target.dtype),
                             "cuda_graphs": isinstance(steps, StepGraphs),
                             "fast_steps": steps is not None},
                "by_temperature": {
                    f"{t:g}": side_by_side(target, draft, prompts, temperature=t,
                                           gamma=args.gamma, repeats=args.repeats,
                                           max_new_tokens=args.max_new_tokens, rows=rows,
                                           device_rows=on_device)
                    for t in temps},
                "notes": notes,
                "tree_costs": tree_costs(target) if any(
                    label.split()[0] in TREES for label, _ in rows) else []}


def main(argv: list[str] | None = None) -> int:
    """`minispec drafters [options]`."""
    args = build_parser().parse_args(argv)
    args.gamma = parse_gamma(args.gamma, auto=False)
    try:
        report = run(args)
    except MinispecError as e:
        print(f"minispec drafters: error: {e}{models_hint(str(e))}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0
