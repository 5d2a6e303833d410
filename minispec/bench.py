"""Benchmarks that tell the truth: measured speedup next to what the theory predicts.

Leviathan et al. 2023 (section 3.4, Theorem 3.8) predict the walltime improvement of speculative
decoding from two numbers: alpha, the expected acceptance rate of a draft token, and c, the cost
of one draft call relative to one target call. With gamma drafts per round, a round emits
(1 - alpha^(gamma+1)) / (1 - alpha) tokens on average (Equation 1) and costs gamma*c + 1 target
calls, if checking gamma + 1 tokens in one target call costs what generating one does. This
module measures each of those quantities on its own (alpha, c, the verify-cost curve
t(k tokens)/t(1 token), the memory-bound floor of a decode step) and the end-to-end speed, so a
report can say where theory and measurement agree and where they part.

    minispec bench                          # the shipped pair on its held-out prompts
    minispec bench --json > bench.json      # the same, for machines
    minispec bench --gamma auto --hf off --num-prompts 50 --repeats 5

The measurement helpers (predicted_speedup, cost_ratio, time_decode_step, ...) are public: the
sweep (minispec/sweep.py) reuses them.

BLAS threads: on a small CPU shared with other work, multi-threaded OpenBLAS makes decode-sized
matmuls (one row times a [D, F] matrix) many times slower than a single thread, because its
threads wait for each other on every call; on an idle machine two threads can be faster. The
benchmark pins the BLAS pool (`blas_threads`, --threads, default 1) for the whole run, times a
decode step at 1 and at all cores, and reports both in its header.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .backend import blas_threads, get_blas_threads, set_blas_threads
from .errors import MinispecError

# ---------------------------------------------------------------------------------------------
# the theory (Leviathan et al. 2023, section 3)


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Expected tokens one round emits: (1 - alpha^(gamma+1)) / (1 - alpha) (Equation 1).

    alpha: expected acceptance rate of a draft token; gamma: drafts per round. alpha = 1 gives
    the limit gamma + 1 (every draft accepted, plus the bonus token).
    """
    _check_alpha_gamma(alpha, gamma)
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: expected walltime improvement (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    c: time of one draft call / time of one target call. Assumes the target checks gamma + 1
    tokens in the time it takes to generate one (see `verify_cost_curve` for how true that is).
    """
    if not c >= 0:
        raise MinispecError(f"c: expected a cost ratio >= 0, got {c!r}")
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def predicted_speedup_measured_verify(alpha: float, gamma: int, c: float, verify_ratio: float
                                      ) -> float:
    """Theorem 3.8 with the verify call's measured cost: E[tokens] / (gamma c + t(gamma+1)/t(1)).

    verify_ratio: t(gamma + 1 tokens in one target call) / t(1 token), from `verify_cost_curve`.
    """
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + verify_ratio)


def _check_alpha_gamma(alpha: float, gamma: float) -> None:
    # gamma may be fractional: the mean drafts per round when gamma varies (gamma="auto")
    if not 0.0 <= alpha <= 1.0:
        raise MinispecError(f"alpha: expected an acceptance rate in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.number)) or not gamma >= 0:
        raise MinispecError(f"gamma: expected a number >= 0, got {gamma!r}")


# BLAS threads: minispec/backend.py (set_blas_threads, blas_threads), re-exported here


# ---------------------------------------------------------------------------------------------
# prompts


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Prompt texts from a file: JSON {"prompts": [{"text": ...} | "text", ...]} (the format of
    weights/prompts.json) or a JSON list of the same; any other file is one prompt per line.

    limit: keep the first `limit` prompts (None: all).
    """
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MinispecError(f"{path}: cannot read the prompt file ({e.strerror})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise MinispecError(f"{path}: not valid JSON ({e})") from None
        items = data.get("prompts") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise MinispecError(f"{path}: expected a list of prompts or {{\"prompts\": [...]}}")
        texts = []
        for i, item in enumerate(items):
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str) or not text:
                raise MinispecError(f"{path}: prompt {i} has no non-empty \"text\" string")
            texts.append(text)
    else:
        texts = [line for line in raw.splitlines() if line.strip()]
    if not texts:
        raise MinispecError(f"{path}: no prompts in the file")
    return texts[:limit] if limit else texts


def encode_prompts(texts: Sequence[str], tokenizer) -> list[list[int]]:
    """Token ids of each prompt, with BOS as the tokenizer adds it (the target's tokenizer)."""
    if tokenizer is None:
        raise MinispecError("prompts: the target has no tokenizer.json, so text prompts cannot "
                            "be encoded")
    return [list(tokenizer.encode(t)) for t in texts]


# ---------------------------------------------------------------------------------------------
# timing primitives


def median(xs: Sequence[float]) -> float:
    """The median (statistics.median), NaN for an empty sequence."""
    return statistics.median(xs) if len(xs) else float("nan")


def _sync(model) -> None:
    """Wait for queued GPU work, so a timer sees it (no-op on the CPU)."""
    if getattr(model, "device", "cpu") == "gpu":
        model.xp.cuda.Device().synchronize()


def time_decode_steps(cases: Sequence[tuple], context: int = 64, repeats: int = 20,
                      warmup: int = 3) -> list[float]:
    """Median seconds of one `forward` of k tokens on a warm cache of `context` positions, for
    each (model, k) in `cases`, timed round-robin (one call of each case in turn) so that a
    change in the machine's load during the measurement affects every case alike.

    The same k tokens are fed and rolled back each time, so every call sees the same cache length:
    k = 1 is a decode step, k = gamma + 1 is a verify call.
    """
    runs = []
    for model, k in cases:
        if k < 1 or context < 1:
            raise MinispecError(f"time_decode_step: need k >= 1 and context >= 1, got {k}, "
                                f"{context}")
        ids = (np.arange(context + k) % min(model.vocab_size, 256)).tolist()
        cache = model.new_cache(context + k)
        model.forward(ids[:context], cache)  # the prefill: a warm cache of `context` positions
        runs.append((model, ids[context:], cache))
    times: list[list[float]] = [[] for _ in runs]
    for i in range(warmup + repeats):
        for j, (model, new, cache) in enumerate(runs):
            t0 = time.perf_counter()
            model.forward(new, cache)
            _sync(model)
            if i >= warmup:
                times[j].append(time.perf_counter() - t0)
            cache.rollback(context)
    return [median(t) for t in times]


def time_decode_step(model, k: int = 1, context: int = 64, repeats: int = 20,
                     warmup: int = 3) -> float:
    """Median seconds of one `forward` of k tokens on a warm cache holding `context` positions
    (see time_decode_steps)."""
    return time_decode_steps([(model, k)], context, repeats, warmup)[0]


def steps_by_threads(model, counts: Sequence[int], context: int = 64, repeats: int = 20
                     ) -> dict[str, float]:
    """{threads: median seconds of a decode step with NumPy's BLAS on that many threads}, the
    counts taken in turn call by call; {} when the BLAS cannot be controlled."""
    if get_blas_threads() is None:
        return {}
    before = get_blas_threads()
    ids = (np.arange(context + 1) % min(model.vocab_size, 256)).tolist()
    cache = model.new_cache(context + 1)
    model.forward(ids[:context], cache)
    times: dict[str, list[float]] = {str(n): [] for n in counts}
    try:
        for i in range(3 + repeats):
            for n in counts:
                set_blas_threads(n)
                t0 = time.perf_counter()
                model.forward(ids[context:], cache)
                if i >= 3:
                    times[str(n)].append(time.perf_counter() - t0)
                cache.rollback(context)
    finally:
        set_blas_threads(before)
    return {n: median(t) for n, t in times.items()}


def time_matmuls(model, k: int = 1, repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds of only the weight matmuls of a k-token forward: every layer's projections
    and the LM head, through model.py's `linear`. The rest of a decode step (norms, RoPE,
    attention over the cache, Python) is the step's time minus this."""
    from .model import linear

    xp, w = model.xp, model.weights
    names = ("wqkv", "wo", "w_gate", "w_up", "w_down")
    mats = [layer[n] for layer in w["layers"] for n in names if layer.get(n) is not None]
    mats.append(w["lm_head"])
    xs = {m.shape[0]: xp.ones((k, m.shape[0]), dtype=model.dtype) for m in mats}
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        for m in mats:
            linear(xs[m.shape[0]], m)
        _sync(model)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return median(times)


def cost_ratio(target, draft, context: int = 64, repeats: int = 20) -> dict[str, float]:
    """c of Theorem 3.8: median draft decode step / median target decode step (one token, warm
    cache of `context` positions). Returns {"c", "draft_step_s", "target_step_s"}."""
    t_draft, t_target = time_decode_steps([(draft, 1), (target, 1)], context, repeats)
    return {"c": t_draft / t_target, "draft_step_s": t_draft, "target_step_s": t_target}


def verify_cost_curve(model, ks: Sequence[int] = range(1, 10), context: int = 64,
                      repeats: int = 20) -> dict[int, float]:
    """{k: t(k tokens in one call) / t(1 token)}: how much checking k tokens costs over one."""
    timed = sorted({1, *ks})
    times = dict(zip(timed, time_decode_steps([(model, k) for k in timed], context, repeats)))
    return {k: times[k] / times[1] for k in ks}


def time_runs(fn: Callable[[], object], repeats: int = 3, warmup: int = 1
              ) -> tuple[float, list[float], object]:
    """Call fn warmup + repeats times; (median seconds of the timed calls, all of them, last
    result)."""
    for _ in range(warmup):
        fn()
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return median(times), times, result


def time_generation(generate: Callable[[list[int]], object], prompts: Sequence[list[int]],
                    repeats: int = 3, warmup: int = 1) -> dict:
    """Time generate(prompt) over the whole prompt set, warmup + repeats passes.

    generate returns a GenerationResult (anything with .tokens and .stats works; .stats may be
    missing). Returns {"seconds": median seconds per pass, "pass_seconds": each timed pass,
    "new_tokens": new tokens per pass, "tokens_per_second": new_tokens / seconds, "results": the
    last pass's results, one per prompt}.
    """
    def one_pass():
        return [generate(list(p)) for p in prompts]

    seconds, passes, results = time_runs(one_pass, repeats, warmup)
    new_tokens = sum(len(r.tokens) for r in results)
    return {"seconds": seconds, "pass_seconds": passes, "new_tokens": new_tokens,
            "tokens_per_second": new_tokens / seconds if seconds > 0 else 0.0,
            "results": results}


# ---------------------------------------------------------------------------------------------
# the memory-bound floor


def _best_seconds(fn, repeats: int, xp) -> float:
    fn()  # fault the pages in, warm the caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if xp is not np:
            xp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, xp=np) -> float:
    """Bytes/s at which the machine streams an nbytes float32 array through the CPU (or GPU):
    nbytes / the best time of `a.max()`, a pass that only reads, like a decode step reading
    its weights. Whether this is DRAM or cache bandwidth depends on nbytes and the cache sizes.
    """
    a = xp.ones(max(nbytes // 4, 1), dtype=np.float32)
    return a.nbytes / _best_seconds(a.max, repeats, xp)


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, xp=np) -> float:
    """Bytes/s of copying an nbytes array, counting the bytes read (= bytes moved / 2): nbytes /
    the best time of a copy. A copy also writes (and the CPU reads each destination line before
    writing it), so this is below `read_bandwidth`."""
    src = xp.ones(max(nbytes // 4, 1), dtype=np.float32)
    dst = xp.empty_like(src)

    def copy():
        dst[...] = src

    return src.nbytes / _best_seconds(copy, repeats, xp)


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every matrix in the compute dtype (all layers and
    the LM head; of the embedding only one row, which is negligible and not counted)."""
    w = model.weights
    seen, total = set(), 0
    arrays = [w["lm_head"], w["norm_w"]] + [a for layer in w["layers"] for a in layer.values()]
    for a in arrays:
        if a is None or id(a) in seen:
            continue
        seen.add(id(a))
        total += int(a.size) * a.dtype.itemsize
    return total


def memory_floor(model, bandwidth: float) -> dict[str, float]:
    """The memory-bound floor of a decode step: weight bytes / bandwidth (seconds, and the
    tokens/s it allows)."""
    nbytes = decode_weight_bytes(model)
    floor_s = nbytes / bandwidth
    return {"weight_bytes": nbytes, "floor_step_s": floor_s, "floor_tokens_per_s": 1.0 / floor_s}


# ---------------------------------------------------------------------------------------------
# the machine


def machine_info() -> dict:
    """CPU model, cores, load average and library versions, for the report header."""
    import os
    import platform

    from . import __version__

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    blas = "unknown"
    with contextlib.suppress(Exception):
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{info.get('name')} {info.get('version')}"
    info = {"cpu": cpu, "cores": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg")
            else None,
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas,
            "minispec": __version__}
    for name in ("torch", "transformers"):  # versions without importing them
        with contextlib.suppress(Exception):
            info[name] = importlib.metadata.version(name)
    return info


# ---------------------------------------------------------------------------------------------
# the benchmark: `minispec bench`

SHIPPED = Path(__file__).resolve().parent.parent / "weights"


def build_parser() -> argparse.ArgumentParser:
    """The `minispec bench` command line."""
    ap = argparse.ArgumentParser(
        prog="minispec bench",
        description="Autoregressive vs speculative decoding on a prompt set: speed, acceptance, "
        "cost ratio, verify-cost curve, Theorem 3.8's prediction, the memory-bound floor, and "
        "Hugging Face transformers on the same pair.",
    )
    ap.add_argument("--target", type=Path, default=SHIPPED / "target", help="target directory")
    ap.add_argument("--draft", type=Path, default=SHIPPED / "draft", help="draft directory")
    ap.add_argument("--prompts", type=Path, default=SHIPPED / "prompts.json",
                    help="prompt file (prompts.json format, or one prompt per line)")
    ap.add_argument("--num-prompts", type=int, default=20, help="first N prompts (0 = all)")
    ap.add_argument("--gamma", default="4", help="draft tokens per round, or 'auto'")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads for numpy (and torch) during the run (default 1)")
    ap.add_argument("--hf", choices=["auto", "on", "off"], default="auto",
                    help="also run transformers' generate and assisted generation "
                    "(auto: when torch and transformers are installed)")
    ap.add_argument("--quick", action="store_true", help="a tiny budget, for tests")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


def synthetic_prompts(vocab_size: int, n: int, length: int = 32, seed: int = 0
                      ) -> list[list[int]]:
    """n prompts of random token ids, for models without a tokenizer (random test models)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, length).tolist() for _ in range(n)]


def _sum_stats(results) -> dict:
    """Counters summed over one pass's GenerationResults, plus rejections (rounds that ended in a
    correction after drafting), which the per-token alpha estimate needs."""
    keys = ("new_tokens", "drafted", "accepted", "target_calls", "draft_calls", "draft_seconds",
            "verify_seconds", "total_seconds")
    total = {k: sum(getattr(r.stats, k) for r in results) for k in keys}
    total["rejections"] = sum(1 for r in results for rd in r.stats.rounds
                              if rd.drafted and rd.accepted < len(rd.drafted))
    total["rounds_with_drafts"] = sum(1 for r in results for rd in r.stats.rounds if rd.drafted)
    return total


def per_token_alpha(accepted: int, rejections: int) -> float:
    """alpha of Leviathan et al. (the probability that a draft token is accepted, modelled as the
    same for every token), estimated as accepted / tested: drafts after a round's first rejection
    are never tested, so accepted / drafted would understate it."""
    tested = accepted + rejections
    return accepted / tested if tested else 0.0


class _HFResult:
    """What the timing helpers need from a generation: the new tokens."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens


def _hf_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _hf_load_pair(args, threads: int) -> dict:
    """The pair in transformers, float32 like minispec's CPU compute: {"torch", "target",
    "draft" (drafting gamma tokens, never cut short), "draft_defaults" (transformers' own
    assisted-generation settings)}."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    dev = "cuda" if args.device == "gpu" else "cpu"

    def load(path):
        try:
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        return m.to(dev).eval()

    hf = {"torch": torch, "target": load(args.target), "draft": load(args.draft),
          "draft_defaults": load(args.draft)}
    if args.gamma != "auto":
        cfg = hf["draft"].generation_config
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = int(args.gamma), "constant"
        cfg.assistant_confidence_threshold = 0.0
    return hf


def hf_time_decode_steps(torch, cases: Sequence[tuple], context: int = 64, repeats: int = 20,
                         warmup: int = 3) -> list[float]:
    """time_decode_steps for transformers models: for each (model, k), the median seconds of a
    k-token forward on a cache of `context` positions (cropped back after each call), the cases
    timed round-robin."""
    runs = []
    with torch.inference_mode():
        for model, k in cases:
            ids = torch.arange(context + k, device=model.device)[None] % 256
            cache = model(ids[:, :context], use_cache=True).past_key_values
            runs.append((model, ids[:, context:], cache, k))
        times: list[list[float]] = [[] for _ in runs]
        for i in range(warmup + repeats):
            for j, (model, new, cache, k) in enumerate(runs):
                t0 = time.perf_counter()
                model(new, past_key_values=cache, use_cache=True)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= warmup:
                    times[j].append(time.perf_counter() - t0)
                cache.crop(-k)  # forget the k tokens just fed
    return [median(t) for t in times]


def _hf_costs(hf: dict, context: int, repeats: int) -> dict:
    """transformers' decode step, c and verify-cost curve on the same pair, for comparison."""
    torch, target, ks = hf["torch"], hf["target"], range(1, 10)
    *times, draft_step = hf_time_decode_steps(
        torch, [*((target, k) for k in ks), (hf["draft"], 1)], context, repeats)
    steps = dict(zip(ks, times))
    return {"target_step_s": steps[1], "draft_step_s": draft_step, "c": draft_step / steps[1],
            "verify_cost": {str(k): t / steps[1] for k, t in steps.items()}}


def _hf_generator(torch, model, *, max_new, temperature, eos, assistant=None):
    """generate(ids) -> _HFResult with transformers' model.generate (assisted if assistant)."""
    kw = {"max_new_tokens": max_new, "do_sample": temperature > 0, "eos_token_id": eos,
              "pad_token_id": eos[0] if eos else 0}
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)

    def generate(ids: list[int]) -> _HFResult:
        x = torch.tensor([ids], device=model.device)
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), assistant_model=assistant,
                                 **kw)
        return _HFResult(out[0, len(ids):].tolist())

    return generate


def _agreement(a: list, b: list) -> dict:
    """How many token lists of a match b exactly, and where the others first differ."""
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((j for j, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            diffs.append({"prompt": i, "first_difference_at": at})
    return {"identical": len(a) - len(diffs), "total": len(a), "differences": diffs}


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark described by parsed `args`; the report as a JSON-ready dict."""
    from .loader import load

    if args.quick:
        args.num_prompts, args.max_new_tokens, args.repeats = 2, 8, 1
    step_repeats, copy_big = (3, 16 * 2**20) if args.quick else (30, 1024 * 2**20)
    gamma = "auto" if args.gamma == "auto" else int(args.gamma)
    use_hf = args.hf == "on" or (args.hf == "auto" and _hf_available())
    if args.hf == "on" and not _hf_available():
        raise MinispecError("--hf on: needs torch and transformers installed")

    target = load(args.target, device=args.device)
    draft = load(args.draft, device=args.device)
    if target.tokenizer is not None and args.prompts.exists():
        texts = load_prompts(args.prompts, args.num_prompts or None)
        prompts, prompt_source = encode_prompts(texts, target.tokenizer), str(args.prompts)
    elif target.tokenizer is None:
        prompts = synthetic_prompts(min(target.vocab_size, draft.vocab_size),
                                    args.num_prompts or 20)
        prompt_source = "synthetic (random ids: the target has no tokenizer)"
    else:
        raise MinispecError(f"--prompts: {args.prompts} does not exist")
    eos = list(target.config.eos_token_ids) or None
    lens = [len(p) for p in prompts]
    context = int(np.mean(lens)) + args.max_new_tokens // 2  # a typical cache length in the run

    report: dict = {
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "settings": {"target": str(args.target), "draft": str(args.draft),
                     "prompts": prompt_source, "num_prompts": len(prompts),
                     "prompt_tokens": [min(lens), max(lens)],
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                     "gamma": gamma, "repeats": args.repeats, "warmup": 1,
                     "device": target.device, "dtype": str(target.dtype),
                     "blas_threads": None, "torch_threads": None, "hf": use_hf},
        "models": {name: {"family": m.config.family, "layers": m.n_layers,
                          "hidden": m.config.hidden_size, "vocab": m.vocab_size,
                          "weight_bytes": decode_weight_bytes(m)}
                   for name, m in (("target", target), ("draft", draft))},
    }
    cores = report["machine"]["cores"] or 1
    with blas_threads(args.threads) as n_threads:
        report["settings"]["blas_threads"] = n_threads
        report["costs"] = _measure_costs(target, draft, context, step_repeats, copy_big,
                                         args.threads, cores, args.quick)
        hf = _hf_load_pair(args, args.threads) if use_hf else None
        if hf is not None:
            report["settings"]["torch_threads"] = hf["torch"].get_num_threads()
            report["costs"]["hf"] = _hf_costs(hf, context, step_repeats)
        methods = _methods(args, target, draft, gamma, eos, hf)
        cases = [(draft, 1), *((target, k) for k in range(1, 10))]
        samples = []  # decode steps timed before each round of passes and after the last

        def time_steps():
            n = max(step_repeats // 4, 2)
            samples.append([*time_decode_steps(cases, context, n), time_matmuls(target, 1, n),
                            time_matmuls(target, 5, n), time_matmuls(draft, 1, n)])

        report["generation"] = _time_methods(methods, prompts, args.repeats, time_steps)
        time_steps()
        report["costs"].update(_step_costs(samples, len(samples) * max(step_repeats // 4, 2)))
    _derive(report, gamma)
    return report


def _measure_costs(target, draft, context, repeats, copy_big, threads, cores, quick) -> dict:
    """The matmuls' share of a step, BLAS threads, bandwidth and the floor (the decode steps,
    c and the verify-cost curve are timed between the generation passes: `_step_costs`)."""
    costs = {"context": context}
    costs["target_step_s_by_threads"] = steps_by_threads(target, sorted({threads, 1, cores}),
                                                         context, repeats)
    xp = target.xp
    weight_bytes = decode_weight_bytes(target)
    costs["bandwidth"] = {"read_weight_sized": read_bandwidth(weight_bytes, 20, xp),
                          "read_large": read_bandwidth(copy_big, 5, xp),
                          "copy_weight_sized": copy_bandwidth(weight_bytes, 20, xp),
                          "copy_large": copy_bandwidth(copy_big, 5, xp),
                          "large_bytes": copy_big}
    costs["floor"] = memory_floor(target, costs["bandwidth"]["read_weight_sized"])
    costs["floor_large"] = memory_floor(target, costs["bandwidth"]["read_large"])
    return costs


def _step_costs(samples: list[list[float]], calls: int) -> dict:
    """c and the verify-cost curve from rounds of time_decode_steps over [(draft, 1), (target,
    1..9)] and time_matmuls of (target, 1), (target, 5), (draft, 1): each case's median."""
    draft_step, *steps = (median(col) for col in zip(*samples))
    steps, matmuls = steps[:9], steps[9:]
    return {"step_calls": calls, "draft_step_s": draft_step, "target_step_s": steps[0],
            "target_matmul_s": matmuls[0], "target_matmul_s_k5": matmuls[1],
            "draft_matmul_s": matmuls[2],
            "c": draft_step / steps[0],
            "verify_cost": {str(k): t / steps[0] for k, t in enumerate(steps, start=1)}}


def _methods(args, target, draft, gamma, eos, hf):
    """{name: generate(ids) -> result} for every method the run compares."""
    from .speculative import autoregressive_generate, speculative_generate

    common = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "eos_token_id": eos}
    methods = {
        "minispec autoregressive":
            lambda ids: autoregressive_generate(target, ids, seed=0, **common),
        "minispec speculative":
            lambda ids: speculative_generate(target, draft, ids, gamma=gamma, seed=0, **common),
    }
    if hf is None:
        return methods
    torch, hf_target = hf["torch"], hf["target"]
    kw = {"max_new": args.max_new_tokens, "temperature": args.temperature, "eos": eos}
    methods["hf generate"] = _hf_generator(torch, hf_target, **kw)
    if gamma != "auto":  # the same pair, the same gamma
        methods["hf assisted"] = _hf_generator(torch, hf_target, assistant=hf["draft"], **kw)
    if gamma == "auto" or not args.quick:
        methods["hf assisted (hf defaults)"] = _hf_generator(
            torch, hf_target, assistant=hf["draft_defaults"], **kw)
    return methods


def _time_methods(methods: dict, prompts, repeats: int, between=None) -> dict:
    """Warm each method up on one prompt, then time `repeats` passes over all prompts, the
    methods interleaved pass by pass so that a noisy neighbour slows them all alike; between()
    (if given) runs before each round of passes."""
    for generate in methods.values():
        generate(list(prompts[0]))
    passes: dict[str, list[float]] = {name: [] for name in methods}
    last: dict[str, list] = {}
    for _ in range(repeats):
        if between is not None:
            between()
        for name, generate in methods.items():
            t0 = time.perf_counter()
            last[name] = [generate(list(p)) for p in prompts]
            passes[name].append(time.perf_counter() - t0)
    out = {}
    for name, results in last.items():
        seconds = median(passes[name])
        new_tokens = sum(len(r.tokens) for r in results)
        row = {"seconds": seconds, "pass_seconds": passes[name], "new_tokens": new_tokens,
               "tokens_per_second": new_tokens / seconds if seconds > 0 else 0.0,
               "outputs": [list(r.tokens) for r in results]}
        if hasattr(results[0], "stats"):
            row["stats"] = _sum_stats(results)
        out[name] = row
    return out


def _derive(report: dict, gamma) -> None:
    """Add the theory, the comparisons, the agreement checks and the aims to `report`."""
    gen, costs = report["generation"], report["costs"]
    ar, sp = gen["minispec autoregressive"], gen["minispec speculative"]
    st, ar_st = sp["stats"], ar["stats"]
    alpha = per_token_alpha(st["accepted"], st["rejections"])
    g = gamma if gamma != "auto" else st["drafted"] / max(st["rounds_with_drafts"], 1)
    c = costs["c"]
    speedup = sp["tokens_per_second"] / ar["tokens_per_second"]
    predicted = predicted_speedup(alpha, g, c)
    verify_ratio = costs["verify_cost"].get(str(round(g) + 1))
    refined = (None if verify_ratio is None
               else predicted_speedup_measured_verify(alpha, g, c, verify_ratio))
    # the same quantities as they come out in the loop: a draft call (with its warp and sample)
    # and a verify call (with warping p and verify()) in units of one autoregressive step
    draft_call_s = st["draft_seconds"] / st["draft_calls"] if st["draft_calls"] else 0.0
    ar_call_s = ar_st["total_seconds"] / ar_st["target_calls"]
    c_loop = draft_call_s / ar_call_s
    r_loop = st["verify_seconds"] / st["target_calls"] / ar_call_s
    tokens_per_call = st["new_tokens"] / st["target_calls"]
    loop_explained = tokens_per_call / (st["draft_calls"] / st["target_calls"] * c_loop + r_loop)
    report["theory"] = {
        "alpha": alpha,
        "acceptance_rate": st["accepted"] / st["drafted"] if st["drafted"] else 0.0,
        "gamma": g, "c": c,
        "expected_tokens_per_call": expected_tokens_per_call(alpha, g),
        "tokens_per_target_call": tokens_per_call,
        "speedup": speedup, "predicted_speedup": predicted,
        "speedup_over_predicted": speedup / predicted,
        "verify_ratio": verify_ratio, "predicted_speedup_measured_verify": refined,
        "speedup_over_predicted_measured_verify": None if refined is None else speedup / refined,
        "c_in_loop": c_loop, "verify_ratio_in_loop": r_loop,
        "draft_calls_per_round": st["draft_calls"] / st["target_calls"],
        "speedup_from_loop_costs": loop_explained,
    }
    vs_hf = {}
    for mine, theirs in (("minispec autoregressive", "hf generate"),
                         ("minispec speculative", "hf assisted"),
                         ("minispec speculative", "hf assisted (hf defaults)")):
        if theirs in gen:
            vs_hf[f"{mine} / {theirs}"] = (gen[mine]["tokens_per_second"]
                                           / gen[theirs]["tokens_per_second"])
    report["vs_hf"] = vs_hf
    agreement = {}
    if report["settings"]["temperature"] == 0:
        for a, b in (("minispec speculative", "minispec autoregressive"),
                     ("hf generate", "minispec autoregressive"),
                     ("hf assisted", "hf generate"),
                     ("hf assisted (hf defaults)", "hf generate")):
            if a in gen and b in gen:
                agreement[f"{a} vs {b}"] = _agreement(gen[a]["outputs"], gen[b]["outputs"])
    report["greedy_agreement"] = agreement
    floor = costs["floor"]
    ar_step_s = ar["seconds"] / ar["new_tokens"]
    report["floor"] = {
        "weight_bytes": floor["weight_bytes"], "bandwidth": costs["bandwidth"]["read_weight_sized"],
        "floor_step_s": floor["floor_step_s"], "floor_tokens_per_second":
        floor["floor_tokens_per_s"], "autoregressive_step_s": ar_step_s,
        "autoregressive_fraction_of_floor": floor["floor_step_s"] / ar_step_s,
        "forward_fraction_of_floor": floor["floor_step_s"] / costs["target_step_s"],
        "floor_step_s_large": costs["floor_large"]["floor_step_s"],
    }
    aims = {
        "speculative >= 2x autoregressive": (speedup, speedup >= 2.0),
        "speculative >= 0.9 x Theorem 3.8": (speedup / predicted, speedup / predicted >= 0.9),
        "autoregressive >= 0.5 x memory floor": (
            report["floor"]["autoregressive_fraction_of_floor"],
            report["floor"]["autoregressive_fraction_of_floor"] >= 0.5),
    }
    for theirs in ("hf assisted", "hf assisted (hf defaults)"):
        key = f"minispec speculative / {theirs}"
        if key in vs_hf:
            aims[f"speculative >= {theirs}"] = (vs_hf[key], vs_hf[key] >= 1.0)
    report["aims"] = {k: {"value": v, "met": bool(ok)} for k, (v, ok) in aims.items()}


def format_report(report: dict) -> str:
    """The report as a table for people."""
    m, s, costs, th = report["machine"], report["settings"], report["costs"], report["theory"]
    ms = 1e3
    soft = [f"python {m['python']}", f"numpy {m['numpy']} ({m['blas']})",
            f"minispec {m['minispec']}"]
    soft += [f"{k} {m[k]}" for k in ("torch", "transformers") if k in m]
    load = " ".join(f"{x:.2f}" for x in m["load_average"]) if m.get("load_average") else "?"

    def model_line(name):
        d = report["models"][name]
        return (f"{s[name]}  {d['family']} L={d['layers']} D={d['hidden']} V={d['vocab']}, "
                f"{d['weight_bytes'] / 1e6:.1f} MB of {s['dtype']} weights per decode step")

    lines = [
        f"minispec bench  {report['date']}",
        f"machine    {m['cpu']}, {m['cores']} cores, load average {load} at start",
        f"software   {', '.join(soft)}",
        f"threads    BLAS {s['blas_threads']} (numpy)"
        + (f", torch {s['torch_threads']}" if s["torch_threads"] else ""),
        f"device     {s['device']}, compute dtype {s['dtype']}",
        f"target     {model_line('target')}",
        f"draft      {model_line('draft')}",
        (f"prompts    {s['prompts']}: {s['num_prompts']} prompts of "
         f"{s['prompt_tokens'][0]}-{s['prompt_tokens'][1]} tokens"),
        (f"decoding   max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}, "
         f"gamma {s['gamma']}"),
        (f"timing     1 warm-up run per method, {s['repeats']} timed passes (methods "
         f"interleaved), medians"),
        "",
        (f"costs (warm cache of {costs['context']} positions; decode steps: medians of "
         f"{costs['step_calls']} calls taken between the timed passes)"),
        (f"  target decode step  {costs['target_step_s'] * ms:7.3f} ms   (its weight matmuls "
         f"alone {costs['target_matmul_s'] * ms:.3f} ms; with 5 tokens "
         f"{costs['target_matmul_s_k5'] * ms:.3f} ms)"),
        (f"  draft decode step   {costs['draft_step_s'] * ms:7.3f} ms   (its weight matmuls "
         f"alone {costs['draft_matmul_s'] * ms:.3f} ms)"),
        (f"  cost ratio c        {costs['c']:7.3f}   (draft step / target step; in the loop, "
         f"with warping and sampling: {th['c_in_loop']:.3f})"),
        "  verify cost t(k)/t(1), k tokens in one target call:",
        "    k     " + " ".join(f"{k:>5}" for k in costs["verify_cost"]),
        "    ratio " + " ".join(f"{r:5.2f}" for r in costs["verify_cost"].values()),
    ]
    if "hf" in costs:
        hf = costs["hf"]
        lines += [
            "    torch " + " ".join(f"{r:5.2f}" for r in hf["verify_cost"].values()),
            (f"  transformers (torch) on the same pair: target step "
             f"{hf['target_step_s'] * ms:.3f} ms, draft step {hf['draft_step_s'] * ms:.3f} ms, "
             f"c = {hf['c']:.3f}"),
        ]
    lines.append("  target decode step by BLAS threads: " + ", ".join(
        f"{n} thread{'s' if n != '1' else ''} {t * ms:.3f} ms"
        for n, t in costs["target_step_s_by_threads"].items()))
    fl, bw = report["floor"], costs["bandwidth"]
    lines += [
        (f"  memory floor        {fl['weight_bytes'] / 1e6:.1f} MB of weights / "
         f"{fl['bandwidth'] / 1e9:.1f} GB/s (best read of a weight-sized array) = "
         f"{fl['floor_step_s'] * ms:.3f} ms/token ({fl['floor_tokens_per_second']:.0f} tok/s)"),
        (f"                      (reading {bw['large_bytes'] / 2**20:.0f} MiB: "
         f"{bw['read_large'] / 1e9:.1f} GB/s, {fl['floor_step_s_large'] * ms:.3f} ms/token; "
         f"copies, bytes read: {bw['copy_weight_sized'] / 1e9:.1f} and "
         f"{bw['copy_large'] / 1e9:.1f} GB/s)"),
        (f"  autoregressive decoding runs at {fl['autoregressive_fraction_of_floor']:.0%} of the "
         f"floor's speed ({fl['autoregressive_step_s'] * ms:.3f} ms/token in the loop; the bare "
         f"forward step at {fl['forward_fraction_of_floor']:.0%})"),
        "",
        "generation (new tokens only)",
        (f"  {'method':<28} {'tok/s':>8} {'tokens':>7} {'alpha':>6} {'tok/call':>8} "
         f"{'speedup':>8}"),
    ]
    gen = report["generation"]
    base = gen["minispec autoregressive"]["tokens_per_second"]
    for name, row in gen.items():
        st = row.get("stats")
        alpha = tok_call = "-"
        if st and st["drafted"]:
            alpha = f"{per_token_alpha(st['accepted'], st['rejections']):.3f}"
        if st:
            tok_call = f"{st['new_tokens'] / st['target_calls']:.2f}"
        lines.append(f"  {name:<28} {row['tokens_per_second']:8.1f} {row['new_tokens']:7d} "
                     f"{alpha:>6} {tok_call:>8} {row['tokens_per_second'] / base:7.2f}x")
    for key, ratio in report["vs_hf"].items():
        lines.append(f"  {key}: {ratio:.2f}x")
    lines += [
        "",
        "theory (Leviathan et al. 2023, Theorem 3.8)",
        (f"  alpha (accepted / tested drafts) {th['alpha']:.3f}   (accepted / drafted "
         f"{th['acceptance_rate']:.3f}: drafts after a rejection are never tested)"),
        (f"  tokens per target call: Equation 1 predicts {th['expected_tokens_per_call']:.2f}, "
         f"measured {th['tokens_per_target_call']:.2f}"),
        (f"  predicted speedup (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1)) with g = "
         f"{th['gamma']:.3g}, c = {th['c']:.3f}: {th['predicted_speedup']:.2f}x"),
        (f"  measured speedup {th['speedup']:.2f}x = {th['speedup_over_predicted']:.2f} of "
         "the prediction"),
    ]
    if th["verify_ratio"] is not None:
        lines.append(
            f"  with the verify call's measured cost t({round(th['gamma']) + 1})/t(1) = "
            f"{th['verify_ratio']:.2f} in place of 1: predicted "
            f"{th['predicted_speedup_measured_verify']:.2f}x, measured = "
            f"{th['speedup_over_predicted_measured_verify']:.2f} of it")
    lines.append(
        f"  in the loop a draft call costs {th['c_in_loop']:.3f} and a verify call "
        f"{th['verify_ratio_in_loop']:.2f} autoregressive steps: "
        f"{th['tokens_per_target_call']:.2f} / ({th['draft_calls_per_round']:.2f} x "
        f"{th['c_in_loop']:.3f} + "
        f"{th['verify_ratio_in_loop']:.2f}) = {th['speedup_from_loop_costs']:.2f}x")
    if report["greedy_agreement"]:
        lines += ["", "greedy outputs"]
        for key, a in report["greedy_agreement"].items():
            where = ", ".join(f"prompt {d['prompt']} from token {d['first_difference_at']}"
                              for d in a["differences"][:5])
            lines.append(f"  {key}: {a['identical']}/{a['total']} identical"
                         + (f" (differ: {where})" if where else ""))
    lines += ["", "aims"]
    for key, a in report["aims"].items():
        lines.append(f"  [{'met' if a['met'] else 'NOT met':>7}] {key}: {a['value']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`minispec bench [options]`: run the benchmark, print a table (or JSON with --json)."""
    args = build_parser().parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0
