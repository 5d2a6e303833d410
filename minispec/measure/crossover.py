"""`minispec crossover`: where speculation stops paying as the batch fills, and a simulated
server with speculation off, on, and load-aware.

    minispec crossover                          # batch 1..32, the shipped pair, a PNG plot
    minispec crossover --batch 1,4,16 --json
    minispec serve                              # Poisson arrivals, continuous batching

crossover: for each batch size B, the same held-out prompts (as many as the largest batch)
decoded B at a time three ways: plain (gamma 0), speculative at a fixed gamma, and load-aware
(minispec/batch.py), methods timed in turn. Beside them the verify-cost curve t(B sequences x k
tokens in one call) explains the crossover: speculation pays while B x E[tokens] / (gamma
t_draft(B) + t(B, gamma+1)) beats B / t(B, 1); and the whole rounds the load-aware policy
weighs, timed as the decoder plays them.

serve: requests arrive as a Poisson process at several rates and are served by continuous
batching (a finished sequence's slot is taken by the next waiting request, up to --slots). The
clock is simulated but every step's time is the measured time of the real computation: a step
of the batch advances the clock by exactly what it took. Per rate and mode: throughput (new
tokens per second of the clock) and each request's latency from arrival to its last token
(p50, p99).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..backend import blas_threads
from ..batch import BatchCosts, BatchDecoder, LoadAwareGamma, calibrate, generate_batch
from ..core.sampling import Sampling
from ..core.speculative import DEFAULT_GAMMA, Request
from ..cpu_steps import enable_where_supported
from ..errors import MinispecError
from ..options import (
    add_dtype,
    add_fast_steps,
    add_gamma,
    add_threads,
    check_positive,
    parse_gamma,
)
from ..shipped import display, path_arg
from . import harness
from .sweep import need_matplotlib, save

METHODS = ("plain", "speculative", "load-aware")


def crossover(target, draft, prompts, *, batch_sizes, gamma: int = DEFAULT_GAMMA,
              max_new_tokens: int = 32, repeats: int = 1, costs: BatchCosts | None = None,
              sequences: int | None = None) -> dict:
    """Tokens per second of plain, speculative (fixed gamma) and load-aware decoding at each
    batch size B, every size decoding the same `sequences` prompts (default: the largest
    size; the first ones, cycled) in batches of B, one after another; the costs behind the
    load-aware choice."""
    if costs is None:
        costs = calibrate(target, draft, batch_sizes=batch_sizes, max_k=max(gamma + 1, 9),
                          drafter=draft)
    eos = harness.benchmark_eos(target)
    n = sequences or max(batch_sizes)
    rows = []
    for B in batch_sizes:
        batches = [[prompts[(j + i) % len(prompts)] for i in range(B)] for j in range(0, n, B)]
        kw = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "eos_token_id": eos,
              "seed": 0, "costs": costs}
        setting = {"plain": (None, 0), "speculative": (draft, gamma),
                   "load-aware": (draft, "load-aware")}
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        decode: dict[str, list[float]] = {m: [] for m in METHODS}
        out = {}
        for _ in range(repeats):  # methods in turn, so a change of load hits all alike
            for m, (drafter, g) in setting.items():
                t0 = time.perf_counter()
                done = [generate_batch(target, drafter, batch, gamma=g, **kw) for batch in batches]
                times[m].append(time.perf_counter() - t0)
                tokens, seconds = np.sum([decode_time(results) for results in done], axis=0)
                decode[m].append(tokens / seconds if seconds > 0 else 0.0)
                out[m] = [r for results in done for r in results]
        row = {"batch": B}
        for m in METHODS:
            tokens = sum(len(r.tokens) for r in out[m])
            rounds = [rd for r in out[m] for rd in r.stats.rounds]
            row[m] = {"tokens_per_second": tokens / harness.median(times[m]),
                      "decode_tokens_per_second": harness.median(decode[m]),
                      "tokens": tokens, "mean_gamma": float(np.mean([rd.gamma for rd in rounds])),
                      "alpha": harness.per_token_alpha(out[m])}
        row["identical"] = all(a.tokens == b.tokens == c.tokens
                               for a, b, c in zip(*(out[m] for m in METHODS)))
        policy = LoadAwareGamma(costs)
        # the alpha speculative decoding measured, as if known for certain (no optimism)
        policy.accepted, policy.tested = row["speculative"]["alpha"] * 1e9, 1e9
        row["predicted"] = {"plain": policy.rate(0, B), "speculative": policy.rate(gamma, B),
                            "load_aware_gamma": policy.choose(B)}
        rows.append(row)
    return {"settings": {"gamma": gamma, "max_new_tokens": max_new_tokens, "repeats": repeats,
                         "batch_sizes": list(batch_sizes), "sequences": n},
            "costs": {"verify": {str(b): {str(k): t for k, t in ks.items()}
                                 for b, ks in costs.verify.items()},
                      "draft": {str(b): t for b, t in costs.draft.items()},
                      "rounds": {str(b): {str(g): t for g, t in gs.items()}
                                 for b, gs in (costs.rounds or {}).items()}},
            "rows": rows, "crossover": _crossover_batch(rows)}


def predict(costs: dict, *, gamma: int, alphas, draft_cost: float = 0.0) -> dict:
    """Plain and speculative throughput predicted from measured call costs {B: {k: seconds}}
    (k = 1 and gamma + 1) at each acceptance rate alpha, where no drafter was run: a round of B
    sequences costs gamma draft steps of draft_cost x t(B, 1) each (0: a drafter without a
    forward pass, prompt lookup) and one verify call t(B, gamma + 1), and yields B E(alpha,
    gamma) tokens (LoadAwareGamma.rate); plain decoding B tokens per t(B, 1). With the smallest
    batch size at which plain decoding is at least as fast, per alpha (None within these)."""
    sizes = sorted(costs)
    bc = BatchCosts(verify={B: dict(costs[B]) for B in sizes},
                    draft={B: draft_cost * costs[B][1] for B in sizes})
    policy = LoadAwareGamma(bc, max_gamma=gamma)
    rows = []
    for B in sizes:
        row = {"batch": B, "t1": costs[B][1], "tk": costs[B][gamma + 1],
               "plain": B / costs[B][1], "speculative": {}}
        for a in alphas:
            row["speculative"][str(a)] = policy.rate(gamma, B, alpha=a)
        rows.append(row)
    stops = {str(a): next((r["batch"] for r in rows
                           if r["plain"] >= r["speculative"][str(a)]), None) for a in alphas}
    return {"gamma": gamma, "alphas": list(alphas), "draft_cost": draft_cost, "rows": rows,
            "stops_paying_at": stops}


def format_predicted(report: dict) -> str:
    """The GPU crossover (`minispec crossover --device gpu`) as text."""
    s, p = report["settings"], report["predicted"]
    g, alphas = p["gamma"], p["alphas"]
    lines = [f"{s['model']} ({s['dtype']}) on {s['gpu']}: one call of B sequences x k tokens "
             f"(layers and head, a CUDA graph, median of {s['repeats']}), each sequence at "
             f"position {s['context']}",
             "throughput PREDICTED from these measured costs (no drafter run): a round costs "
             f"gamma {g} draft steps of {p['draft_cost']:g} x t(B, 1) and one t(B, {g + 1}) "
             f"call, and yields B (1 - a^{g + 1}) / (1 - a) tokens",
             f"{'B':>4} {'t(B,1) ms':>10} {f't(B,{g + 1}) ms':>10} {'ratio':>6} "
             f"{'plain tok/s':>12} " + " ".join(f"{f'spec a={a:g}':>12} {'x':>5}"
                                                 for a in alphas)]
    for r in p["rows"]:
        lines.append(f"{r['batch']:>4} {1e3 * r['t1']:10.3f} {1e3 * r['tk']:10.3f} "
                     f"{r['tk'] / r['t1']:6.2f} {r['plain']:12.0f} "
                     + " ".join(f"{r['speculative'][str(a)]:12.0f} "
                                f"{r['speculative'][str(a)] / r['plain']:5.2f}" for a in alphas))
    for a in alphas:
        b = p["stops_paying_at"][str(a)]
        lines.append(f"alpha {a:g}: speculation stops paying at batch "
                     + (str(b) if b else "(not within these)"))
    return "\n".join(lines)


def gpu_crossover(target, *, batch_sizes, gamma: int, alphas, draft_cost: float = 0.0,
                  context: int = 64, repeats: int = 20) -> dict:
    """The crossover on the GPU, predicted from measured costs (minispec/batch_graphs.py)."""
    from ..batch_graphs import call_costs
    from .roofline import gpu_name

    costs = call_costs(target, batch_sizes=batch_sizes, ks=(1, gamma + 1), context=context,
                       repeats=repeats)
    return {"settings": {"model": target.name, "dtype": str(target.dtype),
                         "gpu": gpu_name(target.xp), "context": context, "repeats": repeats},
            "costs": {str(b): {str(k): t for k, t in ks.items()} for b, ks in costs.items()},
            "predicted": predict(costs, gamma=gamma, alphas=alphas, draft_cost=draft_cost)}


def decode_rate(results) -> float:
    """New tokens per second of a batch's decode phase: after its first round, which holds every
    prompt's prefill (a compute-bound call that batching does not make cheaper). From
    generate_batch's results, whose rounds carry the batch's timings: round i of the batch took
    the longest time any sequence recorded for its round i (each records the time until its
    own verify was settled)."""
    tokens, seconds = decode_time(results)
    return tokens / seconds if seconds > 0 else 0.0


def decode_time(results) -> tuple[int, float]:
    """(new tokens, seconds) of one batch's decode phase (see decode_rate)."""
    steps: dict[int, float] = {}
    tokens = 0
    for r in results:
        for i, rd in enumerate(r.stats.rounds[1:]):
            tokens += len(rd.emitted)
            steps[i] = max(steps.get(i, 0.0), rd.draft_seconds + rd.verify_seconds)
    return tokens, sum(steps.values())


def _crossover_batch(rows) -> int | None:
    """The smallest measured batch size from which plain decoding is faster than speculative."""
    for r in rows:
        if r["plain"]["tokens_per_second"] > r["speculative"]["tokens_per_second"]:
            return r["batch"]
    return None


def serve(target, draft, prompts, *, rates, requests: int = 32, slots: int = 16,
          gamma: int = DEFAULT_GAMMA, max_new_tokens: int = 32, seed: int = 0,
          costs: BatchCosts | None = None) -> dict:
    """The simulated server: for each arrival rate (requests per second of the clock) and each
    mode, the same Poisson arrivals of `requests` held-out prompts, continuous batching with at
    most `slots` sequences, greedy decoding. Returns throughput and latency percentiles."""
    if costs is None:
        costs = calibrate(target, draft, batch_sizes=sorted({1, 2, 4, 8, slots}),
                          max_k=max(gamma + 1, 9), drafter=draft)
    eos = harness.benchmark_eos(target)
    rows = []
    for rate in rates:
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, requests)
        arrivals = np.cumsum(gaps) - gaps[0]  # the first request at time 0
        row = {"rate": rate}
        for mode in METHODS:
            decoder = BatchDecoder(target, None if mode == "plain" else draft, Sampling(),
                                   gamma={"plain": 0, "speculative": gamma,
                                          "load-aware": "load-aware"}[mode], costs=costs)
            clock, waiting, finish, tokens, slot_of = 0.0, list(range(requests)), {}, 0, {}
            while waiting or decoder.live:
                if not decoder.live and arrivals[waiting[0]] > clock:
                    clock = float(arrivals[waiting[0]])  # idle until the next request
                while waiting and arrivals[waiting[0]] <= clock and len(decoder.live) < slots:
                    i = waiting.pop(0)
                    slot_of[decoder.add(prompts[i % len(prompts)],
                                        Request(max_new_tokens, eos))] = i
                t0 = time.perf_counter()
                done = decoder.step()
                clock += time.perf_counter() - t0  # the real time of the real step
                for slot, result in done:
                    finish[slot_of[slot]] = clock
                    tokens += len(result.tokens)
            latency = np.array([finish[i] - arrivals[i] for i in range(requests)])
            row[mode] = {"tokens_per_second": tokens / clock, "tokens": tokens,
                         "latency_p50_s": float(np.percentile(latency, 50)),
                         "latency_p99_s": float(np.percentile(latency, 99))}
        rows.append(row)
    return {"settings": {"requests": requests, "slots": slots, "gamma": gamma,
                         "max_new_tokens": max_new_tokens, "seed": seed, "rates": list(rates)},
            "rows": rows}


# ---- reports ------------------------------------------------------------------------------------


def format_crossover(report: dict) -> str:
    s = report["settings"]
    lines = [f"tokens per second, {s['max_new_tokens']} new tokens per sequence, greedy, "
             f"speculative gamma {s['gamma']} (median of {s['repeats']} run(s), methods in turn); "
             f"every batch size decodes the same {s['sequences']} prompts, B at a time",
             f"{'batch':>5} {'plain':>9} {'spec':>9} {'load-aware':>10} {'(gamma)':>8} "
             f"{'spec/plain':>10} {'aware/best':>10} {'alpha':>6}"]
    for r in report["rows"]:
        p, sp, la = (r[m]["tokens_per_second"] for m in METHODS)
        lines.append(f"{r['batch']:>5} {p:9.1f} {sp:9.1f} {la:10.1f} "
                     f"{r['load-aware']['mean_gamma']:8.2f} {sp / p:10.2f} "
                     f"{la / max(p, sp):10.2f} {r['speculative']['alpha']:6.3f}")
    x = report["crossover"]
    lines.append("speculation stops paying at batch " + (str(x) if x else "(not within these)"))
    lines.append("")
    lines.append("the decode phase (after the batch's first round, which holds every prompt's "
                 "prefill): tokens per second")
    lines.append(f"{'batch':>5} {'plain':>9} {'spec':>9} {'load-aware':>10} {'plain/B1':>9} "
                 f"{'spec/plain':>10} {'aware/best':>10}")
    first = report["rows"][0]["plain"]["decode_tokens_per_second"] if report["rows"] else 0.0
    for r in report["rows"]:
        p, sp, la = (r[m]["decode_tokens_per_second"] for m in METHODS)
        lines.append(f"{r['batch']:>5} {p:9.1f} {sp:9.1f} {la:10.1f} "
                     f"{p / first if first else 0.0:9.2f} {sp / p if p else 0.0:10.2f} "
                     f"{la / max(p, sp) if max(p, sp) else 0.0:10.2f}")
    lines.append("")
    lines.append("the verify-cost curve: t(B sequences x k tokens in one target call) / "
                 "t(1 x 1), and a draft step t_draft(B) / t(1 x 1)")
    verify, draft = report["costs"]["verify"], report["costs"]["draft"]
    base = verify[min(verify, key=int)]["1"]
    ks = sorted(int(k) for k in next(iter(verify.values())))
    lines.append(f"{'B':>5} " + " ".join(f"{'k=' + str(k):>6}" for k in ks) + f" {'draft':>7}")
    for b in sorted(verify, key=int):
        lines.append(f"{b:>5} " + " ".join(f"{verify[b][str(k)] / base:6.2f}" for k in ks)
                     + f" {draft[b] / base:7.3f}")
    g = report["settings"]["gamma"]
    lines.append(f"speculation pays while B x E[tokens] / (gamma t_draft(B) + t(B, {g + 1})) > "
                 f"B / t(B, 1); at batch 1 a {g + 1}-token call costs "
                 f"{verify[min(verify, key=int)][str(g + 1)] / base:.2f} one-token calls")
    rounds = report["costs"].get("rounds")
    if rounds:
        gs = [x for x in ("0", "1", "2", str(g), "8") if x in next(iter(rounds.values()))]
        gs = sorted(set(gs), key=int)
        lines.append("")
        lines.append("what load-aware weighs: a whole round of B sequences drafting gamma "
                     "tokens each, as the decoder plays it (draft steps with their draws, the "
                     "call, every verify), over t(1 x 1)")
        lines.append(f"{'B':>5} " + " ".join(f"{'g=' + x:>6}" for x in gs))
        for b in sorted(rounds, key=int):
            lines.append(f"{b:>5} " + " ".join(f"{rounds[b][x] / base:6.2f}" for x in gs))
    return "\n".join(lines)


def format_serve(report: dict) -> str:
    s = report["settings"]
    lines = [f"simulated server: {s['requests']} requests (held-out prompts, {s['max_new_tokens']}"
             f" new tokens each, greedy) at Poisson rates, continuous batching, {s['slots']} "
             f"slots; speculative gamma {s['gamma']}",
             f"{'rate/s':>7} {'mode':<12} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7}"]
    for r in report["rows"]:
        for m in METHODS:
            x = r[m]
            lines.append(f"{r['rate']:>7g} {m:<12} {x['tokens_per_second']:8.1f} "
                         f"{x['latency_p50_s']:7.3f} {x['latency_p99_s']:7.3f}")
    return "\n".join(lines)


def plot(crossover_report: dict | None, serve_report: dict | None, path: str) -> str:
    """Throughput against batch size (a crossover report), or throughput and latency against
    the arrival rate (a serve report), each panel titled, written to `path` (needs matplotlib)."""
    need_matplotlib(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = dict(zip(METHODS, ("o-", "s--", "^:")))
    if crossover_report is not None:
        report, s = crossover_report, crossover_report["settings"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [r["batch"] for r in report["rows"]]
        for m in METHODS:
            ax.plot(xs, [r[m]["tokens_per_second"] for r in report["rows"]], styles[m], label=m)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel("batch size (sequences decoded together)")
        ax.set_ylabel("new tokens per second")
        ax.set_title(f"Throughput against batch size\nplain, speculative (gamma {s['gamma']}) "
                     f"and load-aware; {s['max_new_tokens']} new tokens per sequence",
                     fontsize=11)
        ax.legend()
    else:
        report, s = serve_report, serve_report["settings"]
        fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4.5))
        xs = [r["rate"] for r in report["rows"]]
        for m in METHODS:
            ax.plot(xs, [r[m]["tokens_per_second"] for r in report["rows"]], styles[m], label=m)
            lat.plot(xs, [r[m]["latency_p50_s"] for r in report["rows"]], styles[m],
                     label=f"{m} p50")
            lat.plot(xs, [r[m]["latency_p99_s"] for r in report["rows"]], styles[m][0],
                     color=lat.lines[-1].get_color(), alpha=0.4, label=f"{m} p99")
        for a in (ax, lat):
            a.set_xscale("log", base=2)
            a.set_xticks(xs, [f"{x:g}" for x in xs])
            a.set_xlabel("arrival rate (requests per second)")
        ax.set_ylabel("new tokens per second")
        ax.set_title("Throughput")
        lat.set_ylabel("seconds from arrival to last token")
        lat.set_title("Latency (p50 line, p99 faint markers)")
        ax.legend()
        lat.legend(fontsize=8, ncol=2)
        fig.suptitle(f"Simulated server: {s['requests']} requests per rate, {s['slots']} slots, "
                     f"speculative gamma {s['gamma']}")
    fig.tight_layout()
    return save(fig, path)


# ---- the command line ---------------------------------------------------------------------------


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", type=path_arg, default="shipped:target",
                    help="target directory (default: %(default)s)")
    ap.add_argument("--draft", type=path_arg, default="shipped:draft",
                    help="draft directory (default: %(default)s)")
    ap.add_argument("--prompts", type=path_arg, default="shipped:prompts.json",
                    help="prompt file, prompts.json format or one prompt per line "
                    "(default: %(default)s)")
    add_gamma(ap, auto=False, what="speculative decoding's fixed gamma")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per sequence")
    add_threads(ap)
    add_fast_steps(ap)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="write a plot (needs the plot extra: pip install 'minispec[plot]')")
    return ap


MAX_BATCH = 1024  # sequences in one batch: each holds a cache of its own
MAX_SEQUENCES = 4096  # prompts a run decodes at every batch size, or requests a rate serves


def _counts(args, batch_sizes=()) -> None:
    """The counts of a run, checked before anything is loaded or timed (MinispecError naming
    the flag): positive, batches of at most MAX_BATCH and runs of at most MAX_SEQUENCES
    sequences, a batch no larger than the sequences it decodes."""
    check_positive(args, "repeats", "max_new_tokens", "sequences", "requests", "slots")
    for flag, value, most in (("--batch", max(batch_sizes, default=1), MAX_BATCH),
                              ("--slots", getattr(args, "slots", 1), MAX_BATCH),
                              ("--sequences", getattr(args, "sequences", None) or 1,
                               MAX_SEQUENCES),
                              ("--requests", getattr(args, "requests", 1), MAX_SEQUENCES)):
        if value > most:
            raise MinispecError(f"{flag}: at most {most}, got {value}")
    sequences = getattr(args, "sequences", None)
    if sequences is not None and max(batch_sizes, default=1) > sequences:
        raise MinispecError(f"--batch {max(batch_sizes)}: larger than --sequences {sequences} "
                            "(every batch size decodes the same --sequences prompts)")


def _ints(text: str, flag: str, kind=int) -> list:
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise MinispecError(f"{flag}: expected a comma-separated list of positive numbers, "
                            f"got {text!r}")
    return values


def _load(args):
    from ..loader import load

    for flag, path in (("--target", args.target), ("--draft", args.draft),
                       ("--prompts", args.prompts)):
        if not path.exists():
            raise MinispecError(f"{flag}: {path} does not exist")
    target, draft = load(args.target, device="cpu"), load(args.draft, device="cpu")
    if args.fast_steps == "on":  # a batch of one sequence takes the CPU step (cpu_steps.py)
        enable_where_supported(target, draft)
    prompts = harness.encode_prompts(harness.load_prompts(args.prompts), target.tokenizer)
    harness.check_room(target, prompts, args.max_new_tokens, [args.gamma], display(args.prompts))
    return target, draft, prompts


def main(argv: list[str] | None = None) -> int:
    """`minispec crossover [options]`."""
    ap = _parser("minispec crossover", "Throughput of plain, speculative and load-aware "
                 "decoding by batch size: where speculation stops paying, and why.")
    ap.add_argument("--batch", default=None,
                    help="batch sizes (default 1,2,4,8,16,32; on the GPU 1,2,4,8,16,32,64; each at "
                    f"most {MAX_BATCH})")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per setting (median)")
    ap.add_argument("--sequences", type=int, default=None,
                    help="prompts every batch size decodes, B at a time (default: the largest "
                    f"batch size; at most {MAX_SEQUENCES})")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="gpu: the costs of a batch's call through CUDA graphs, and from them "
                    "plain and speculative throughput predicted at --alphas (no decoding)")
    add_dtype(ap)
    ap.add_argument("--random-llama-1b", type=Path, default=None, metavar="DIR",
                    help="with --device gpu: write a random 1.2B Llama-shaped checkpoint to DIR "
                    "(needs torch and transformers) and measure it instead of --target")
    ap.add_argument("--alphas", default="0.6,0.8",
                    help="with --device gpu: acceptance rates to predict at")
    ap.add_argument("--draft-cost", type=float, default=0.0,
                    help="with --device gpu: a draft step's cost as a share of t(B, 1) (0: a "
                    "drafter without a forward pass)")
    args = ap.parse_args(argv)
    args.gamma = parse_gamma(args.gamma, auto=False)
    if args.device == "gpu":
        return _gpu_main(args)
    if args.random_llama_1b is not None or args.dtype not in (None, "float32"):
        raise MinispecError("--random-llama-1b and --dtype float16 are for --device gpu (the "
                            "CPU's crossover decodes the shipped pair in float32)")
    sizes = _ints(args.batch or "1,2,4,8,16,32", "--batch")
    _counts(args, sizes)
    need_matplotlib(args.plot)  # before a long measurement, not after it
    with blas_threads(args.threads):
        target, draft, prompts = _load(args)
        if not args.json:
            print("calibrating the batched calls ...", file=sys.stderr, flush=True)
        report = crossover(target, draft, prompts, batch_sizes=sizes, gamma=args.gamma,
                           max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                           sequences=args.sequences)
    print(json.dumps(report, indent=1) if args.json else format_crossover(report))
    if args.plot:
        print(plot(report, None, args.plot), file=sys.stderr if args.json else sys.stdout)
    return 0


def _gpu_main(args) -> int:
    """`minispec crossover --device gpu`: measured costs, predicted throughput."""
    from ..loader import load
    from .roofline import write_random_llama

    sizes = _ints(args.batch or "1,2,4,8,16,32,64", "--batch")
    _counts(args, sizes)
    alphas = _ints(args.alphas, "--alphas", float)
    if max(alphas) >= 1:
        raise MinispecError(f"--alphas: each in (0, 1), got {args.alphas!r}")
    if not args.draft_cost >= 0:  # NaN too
        raise MinispecError(f"--draft-cost: expected a number >= 0, got {args.draft_cost!r}")
    path = args.target
    if args.random_llama_1b is not None:
        path = write_random_llama(args.random_llama_1b)
    target = load(path, device="gpu", dtype=args.dtype)
    report = gpu_crossover(target, batch_sizes=sizes, gamma=args.gamma, alphas=alphas,
                           draft_cost=args.draft_cost, repeats=max(args.repeats, 20))
    print(json.dumps(report, indent=1) if args.json else format_predicted(report))
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    """`minispec serve [options]`: the simulated server."""
    ap = _parser("minispec serve", "A simulated server: Poisson arrivals, continuous "
                 "batching, speculation off / on / load-aware; throughput and latency.")
    ap.add_argument("--rates", default="1,4,16,64", help="arrival rates, requests per second")
    ap.add_argument("--requests", type=int, default=32,
                    help=f"requests per rate and mode (at most {MAX_SEQUENCES})")
    ap.add_argument("--slots", type=int, default=16,
                    help=f"the batch's most sequences (at most {MAX_BATCH})")
    args = ap.parse_args(argv)
    args.gamma = parse_gamma(args.gamma, auto=False)
    rates = _ints(args.rates, "--rates", float)
    _counts(args)
    need_matplotlib(args.plot)
    with blas_threads(args.threads):
        target, draft, prompts = _load(args)
        report = serve(target, draft, prompts, rates=rates, requests=args.requests,
                       slots=args.slots, gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    print(json.dumps(report, indent=1) if args.json else format_serve(report))
    if args.plot:
        print(plot(None, report, args.plot), file=sys.stderr if args.json else sys.stdout)
    return 0
