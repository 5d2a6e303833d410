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
    minispec bench --plot verify_cost.png   # and the verify-cost curve, drawn
    minispec bench --gamma auto --hf off --num-prompts 50 --repeats 5
    minispec bench --target DIR --draft none  # no draft model: prompt lookup and early exit,
                                              # beside transformers' prompt lookup

Every quantity is measured by the one harness (minispec/measure/harness.py), the same way
`minispec sweep` measures it: run both on one pair and they report the same c and speedup.

BLAS threads: on a small CPU shared with other work, multi-threaded OpenBLAS makes decode-sized
matmuls (one row times a [D, F] matrix) many times slower than a single thread, because its
threads wait for each other on every call; on an idle machine two threads can be faster. The
benchmark pins the BLAS pool (`blas_threads`, --threads, default 1) for the whole run, times a
decode step at 1 and at all cores, and reports both in its header.

The weight products: a target call of k tokens, k = 1..16, is timed with minispec's few-rows
kernel (backend.few_rows_matmul, the default when numba is installed), with NumPy's BLAS for every
product (backend.use_kernel(False)), and in torch when it is installed; `--plot` draws the three
curves beside the memory floor.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from ..backend import (
    KERNEL_MAX_ROWS,
    blas_threads,
    kept_as_blocks,
    kept_for_int8,
    kernel_available,
    use_kernel,
)
from ..core.sampling import Sampling
from ..cpu_steps import MAX_TOKENS, enable_where_supported
from ..drafters import (
    AUTO_GAMMA,
    EAGLE_COPY,
    EAGLE_STOP,
    MODEL_STOP,
    PRESET_GAMMA,
    PRESETS,
    head_draft_vocab,
)
from ..errors import MinispecError
from ..kernels import one_row_ahead
from ..options import (
    add_activations,
    add_device,
    add_dtype,
    add_fast_steps,
    add_gamma,
    add_threads,
    check_activations,
    check_num_prompts,
    check_positive,
    parse_gamma,
)
from ..shipped import display, path_arg
from . import harness
from .harness import (
    arithmetic_per_token,
    benchmark_eos,
    copy_bandwidth,
    decode_weight_bytes,
    encode_prompts,
    expected_tokens_per_call,
    load_prompts,
    loop_costs,
    machine_info,
    median,
    memory_floor,
    predicted_speedup,
    predicted_speedup_measured_verify,
    read_bandwidth,
    steps_by_threads,
    synthetic_prompts,
    time_decode_steps,
    time_matmuls,
    time_speed_and_costs,
    typical_context,
)


def build_parser() -> argparse.ArgumentParser:
    """The `minispec bench` command line."""
    ap = argparse.ArgumentParser(
        prog="minispec bench",
        description="Autoregressive vs speculative decoding on a prompt set: speed, acceptance, "
        "cost ratio, verify-cost curve, Theorem 3.8's prediction, the memory-bound floor, and "
        "Hugging Face transformers on the same pair.",
    )
    ap.add_argument("--target", type=path_arg, default="shipped:target",
                    help="target directory (default: %(default)s)")
    ap.add_argument("--draft", default="shipped:draft",
                    help="draft directory, or 'none': the target alone, with the drafters of "
                    "--drafters and transformers' prompt lookup (a target with no draft model; "
                    "default: %(default)s)")
    ap.add_argument("--drafters", default=None, metavar="NAME,...",
                    help="with --draft none: minispec's drafters to run (default "
                    f"{DEFAULT_SELF_DRAFTERS}), some of "
                    f"{', '.join(SELF_DRAFTERS)} (-tree: 2,2,1,1; eagle-2: dynamic tree "
                    "4,3,2,2, beam 3, 12 nodes; eagle-stop: a chain of dynamic length, --stop "
                    f"{EAGLE_STOP:g}; eagle-copy: eagle-stop that copies from the context "
                    f"once a draft agrees with a lookup of {EAGLE_COPY}+ tokens, --copy "
                    f"{EAGLE_COPY}; auto: prompt lookup in the rounds where the context "
                    "repeats, eagle-copy's chain in the others, up to "
                    f"{AUTO_GAMMA} drafts a round whatever --gamma); medusa, eagle and auto "
                    "take the heads trained for the target")
    ap.add_argument("--assistant", type=path_arg, default=None, metavar="DIR",
                    help="with --draft none: also a draft model that both minispec (its chain, "
                    "'minispec model', and its chain ended by its confidence, 'minispec "
                    "model-stop') and transformers (assisted generation: 'hf assisted', "
                    "gamma tokens a round, and 'hf assisted (hf defaults)') draft with")
    ap.add_argument("--prompts", type=path_arg, default="shipped:prompts.json",
                    help="prompt file, prompts.json format or one prompt per line "
                    "(default: %(default)s)")
    ap.add_argument("--num-prompts", type=int, default=20, help="first N prompts (0 = all)")
    add_gamma(ap)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    add_device(ap)
    add_dtype(ap)
    add_activations(ap)
    add_threads(ap)
    add_fast_steps(ap)
    ap.add_argument("--hf", choices=["auto", "on", "off"], default="auto",
                    help="also run transformers' generate and assisted generation "
                    "(auto: when torch and transformers are installed)")
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="draw the verify-cost curves beside the memory floor (needs matplotlib)")
    ap.add_argument("--quick", action="store_true", help="a tiny budget, for tests")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


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

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)

    def load(path):
        return _hf_load(path, args.device)

    hf = {"torch": torch, "target": load(args.target), "draft": load(args.draft),
          "draft_defaults": load(args.draft)}
    if args.gamma != "auto":
        _draft_exactly(hf["draft"], int(args.gamma))
    return hf


def _draft_exactly(assistant, gamma: int):
    """Set transformers' assistant to draft gamma tokens every round, never cut short (as
    minispec's chain does), instead of its own schedule; returns it."""
    cfg = assistant.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = gamma, "constant"
    cfg.assistant_confidence_threshold = 0.0
    return assistant


def _hf_load(path, device: str):
    """A transformers model from the directory `path`, float32 like minispec's CPU compute, on
    the GPU for device "gpu"."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    return m.to("cuda" if device == "gpu" else "cpu").eval()


def _cache_kwarg(model, cache) -> dict:
    """The KV cache as this transformers' forward takes it: `cache` (5.x renamed it, and warns
    on the old name) or `past_key_values`."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def hf_time_decode_steps(torch, cases: Sequence[tuple], context: int = 64, repeats: int = 20,
                         warmup: int = 3) -> list[float]:
    """time_decode_steps for transformers models: for each (model, k), the median seconds of a
    k-token forward on a cache of `context` positions (cropped back after each call), the cases
    timed round-robin."""
    runs = []
    with torch.inference_mode():
        for model, k in cases:
            ids = torch.arange(context + k, device=model.device)[None] % min(
                model.config.vocab_size, 256)
            out = model(ids[:, :context], use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            runs.append((model, ids[:, context:], cache, k, _cache_kwarg(model, cache)))
        times: list[list[float]] = [[] for _ in runs]
        for i in range(warmup + repeats):
            for j, (model, new, cache, k, kwarg) in enumerate(runs):
                t0 = time.perf_counter()
                model(new, use_cache=True, **kwarg)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= warmup:
                    times[j].append(time.perf_counter() - t0)
                cache.crop(-k)  # forget the k tokens just fed
    return [median(t) for t in times]


def _hf_costs(hf: dict, context: int, repeats: int) -> dict:
    """transformers' decode step, c and verify-cost curve on the same pair, for comparison."""
    torch, target = hf["torch"], hf["target"]
    *times, draft_step = hf_time_decode_steps(
        torch, [*((target, k) for k in CURVE_KS), (hf["draft"], 1)], context, repeats)
    steps = dict(zip(CURVE_KS, times))
    return {"target_step_s": steps[1], "draft_step_s": draft_step, "c": draft_step / steps[1],
            "verify_cost": {str(k): steps[k] / steps[1] for k in range(1, 10)},
            "target_call_s": {str(k): t for k, t in steps.items()}}


CURVE_KS = range(1, 17)  # the verify-cost curves: target calls of 1..16 tokens


class NumpyProducts:
    """A model whose forward runs with the few-rows kernel off (every weight product NumPy's
    `x @ w`, on float32 weights: BF16 ones widened once, here): what the timing functions need
    to time the BLAS path beside the kernel."""

    def __init__(self, model) -> None:
        from ..loader import widened

        self.model, self.vocab_size = widened(model), model.vocab_size
        self.device, self.xp = model.device, model.xp

    def new_cache(self, max_len: int | None = None):
        return self.model.new_cache(max_len)

    def forward(self, tokens, cache):
        with use_kernel(False):
            return self.model.forward(tokens, cache)


def _hf_generator(torch, model, *, max_new, temperature, eos, assistant=None,
                  prompt_lookup: int | None = None):
    """generate(ids) -> _HFResult with transformers' model.generate (assisted if assistant, or
    with prompt lookup drafting `prompt_lookup` tokens a round)."""
    kw = {"max_new_tokens": max_new, "do_sample": temperature > 0, "eos_token_id": eos,
          "pad_token_id": eos[0] if eos else 0}
    if prompt_lookup:
        kw["prompt_lookup_num_tokens"] = prompt_lookup
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


def _check_counts(args: argparse.Namespace) -> None:
    """--repeats and --max-new-tokens positive, --num-prompts >= 0 (0: all): MinispecError
    naming the flag before anything is loaded; run and run_without_draft check first thing
    (`minispec real bench` calls run_without_draft with its own options, not main)."""
    check_positive(args, "repeats", "max_new_tokens")
    check_num_prompts(args)


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark described by parsed `args`; the report as a JSON-ready dict."""
    from ..loader import load

    _check_counts(args)
    if args.quick:
        args.num_prompts, args.max_new_tokens, args.repeats = 2, 8, 1
    step_repeats, copy_big = (3, 16 * 2**20) if args.quick else (30, 1024 * 2**20)
    gamma = args.gamma
    use_hf = args.hf == "on" or (args.hf == "auto" and _hf_available())
    if args.hf == "on" and not _hf_available():
        raise MinispecError("--hf on: needs torch and transformers installed")

    check_activations(args)
    target = load(args.target, device=args.device, dtype=args.dtype,
                  activations=args.activations)
    draft = load(args.draft, device=args.device, dtype=args.dtype)
    if args.fast_steps == "on":
        enable_where_supported(target, draft)
    if target.tokenizer is not None and args.prompts.exists():
        texts = load_prompts(args.prompts, args.num_prompts or None)
        prompts, prompt_source = encode_prompts(texts, target.tokenizer), display(args.prompts)
    elif target.tokenizer is None:
        prompts = synthetic_prompts(min(target.vocab_size, draft.vocab_size),
                                    args.num_prompts or 20)
        prompt_source = "synthetic (random ids: the target has no tokenizer)"
    else:
        raise MinispecError(f"--prompts: {args.prompts} does not exist")
    harness.check_room(target, prompts, args.max_new_tokens, [gamma], prompt_source)
    eos = benchmark_eos(target)
    lens = [len(p) for p in prompts]
    context = typical_context(prompts, args.max_new_tokens)  # the costs are timed there

    report: dict = {
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "settings": {"target": display(args.target), "draft": display(args.draft),
                     "prompts": prompt_source, "num_prompts": len(prompts),
                     "prompt_tokens": [min(lens), max(lens)],
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                     "gamma": gamma, "repeats": args.repeats, "warmup": 1,
                     "device": target.device, "dtype": str(target.dtype),
                     "blas_threads": None, "torch_threads": None, "hf": use_hf,
                     "weight_products": _products(target),
                     "greedy_vocab": _greedy_vocab_size(target, draft)},
        "models": {name: {"family": m.config.family, "layers": m.n_layers,
                          "hidden": m.config.hidden_size, "vocab": m.vocab_size,
                          "weight_bytes": decode_weight_bytes(m)}
                   for name, m in (("target", target), ("draft", draft))},
    }
    cores = report["machine"]["cores"] or 1
    with blas_threads(args.threads) as n_threads:
        report["settings"]["blas_threads"] = n_threads
        harness.progress("step costs, the verify-cost curve and the memory bandwidth")
        report["costs"] = _measure_costs(target, draft, context, step_repeats, copy_big,
                                         args.threads, cores, args.quick)
        hf = _hf_load_pair(args, args.threads) if use_hf else None
        if hf is not None:
            report["settings"]["torch_threads"] = hf["torch"].get_num_threads()
            report["costs"]["hf"] = _hf_costs(hf, context, step_repeats)
        methods = _methods(args, target, draft, gamma, eos, hf)
        samples = []  # the verify-cost curve and the matmuls, timed beside round_costs
        g_costs = gamma if gamma != "auto" else 5  # auto starts at 5

        # both products on the CPU with numba; else one (the kernel's path is then NumPy's)
        paths = [target] + ([NumpyProducts(target)] if kernel_in_use(target) else [])

        def time_steps():  # each path in a round-robin of its own: a first call after the
            # other path's (NumPy's widened copy of the weights) ran 2x slow, its weights gone
            # cold in the caches (the shipped target's t(1) 3.8 ms against 1.7 on an AVX-512 Xeon)
            n = max(step_repeats // 4, 2)
            samples.append(([t for m in paths
                             for t in time_decode_steps([(m, k) for k in CURVE_KS], context, n)],
                            [time_matmuls(target, 1, n), time_matmuls(target, 5, n),
                             time_matmuls(draft, 1, n)]))

        report["generation"], rounds = time_speed_and_costs(
            methods, prompts, args.repeats, target, draft, g_costs, context, between=time_steps)
        report["costs"].update(_step_costs(rounds, samples, g_costs))
    for row in report["generation"].values():
        del row["results"]  # GenerationResults: not JSON
    _derive(report, gamma)
    return report


SELF_DRAFTERS = PRESETS  # drafters without a draft model (drafters.PRESETS)
DEFAULT_SELF_DRAFTERS = "ngram,early-exit"  # --draft none's --drafters when none are named


def run_without_draft(args: argparse.Namespace) -> dict:
    """`--draft none`: the target alone, no draft model and no trained heads. minispec's
    autoregressive decoding and the drafters of --drafters (prompt lookup, early exit), beside
    transformers' generate and its assisted generation by prompt lookup
    (prompt_lookup_num_tokens = gamma) on the same checkpoint and prompts, methods interleaved
    (harness.time_methods); the target's decode step and verify call, in minispec and in torch.
    With --assistant, a draft model drafts for both minispec and transformers' assisted
    generation. At T = 0 every method's output is checked against autoregressive decoding's."""
    from ..core.speculative import Request, generate
    from ..drafters import NoDrafter, TunedModelDrafter, make_drafter
    from ..loader import load

    _check_counts(args)
    if args.quick:
        args.num_prompts, args.max_new_tokens, args.repeats = 1, 8, 1
    if args.gamma == "auto":
        raise MinispecError("--gamma auto: with --draft none give a number (transformers' prompt "
                            "lookup drafts a fixed count)")
    gamma = int(args.gamma)
    names = [n.strip() for n in (args.drafters or DEFAULT_SELF_DRAFTERS).split(",") if n.strip()]
    if not names:
        raise MinispecError(f"--drafters: expected some of {', '.join(SELF_DRAFTERS)}, got "
                            f"{args.drafters!r}")
    for n in names:
        if n not in SELF_DRAFTERS:
            raise MinispecError(f"--drafters: {n!r}: with --draft none expected some of "
                                f"{', '.join(SELF_DRAFTERS)}")
    use_hf = args.hf == "on" or (args.hf == "auto" and _hf_available())
    if args.hf == "on" and not _hf_available():
        raise MinispecError("--hf on: needs torch and transformers installed")
    check_activations(args)
    target = load(args.target, device=args.device, dtype=args.dtype,
                  activations=args.activations)
    assistant = (None if args.assistant is None
                 else load(args.assistant, device=args.device, dtype=args.dtype))
    if args.fast_steps == "on":
        enable_where_supported(target, assistant)
    if target.tokenizer is None:  # as run() does
        prompts = synthetic_prompts(target.vocab_size, args.num_prompts or 20)
        prompt_source = "synthetic (random ids: the target has no tokenizer)"
    else:
        prompts = encode_prompts(load_prompts(args.prompts, args.num_prompts or None),
                                 target.tokenizer)
        prompt_source = str(args.prompts)
    harness.check_room(target, prompts, args.max_new_tokens,
                       [gamma] + [PRESET_GAMMA.get(n, gamma) for n in names], prompt_source)
    lens = [len(p) for p in prompts]
    context = typical_context(prompts, args.max_new_tokens)
    sampling = Sampling(args.temperature)
    request = Request(args.max_new_tokens, benchmark_eos(target), seed=0)
    steps = 3 if args.quick else 20
    report: dict = {
        "machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "settings": {"target": display(args.target), "draft": None,
                     "assistant": None if assistant is None else display(args.assistant),
                     "prompts": prompt_source,
                     "num_prompts": len(prompts), "prompt_tokens": [min(lens), max(lens)],
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                     "gamma": gamma, "repeats": args.repeats, "device": target.device,
                     "warmup": 0 if args.quick else 1,  # --quick: outputs and counts only
                     "weight_products": _products(target), "hf": use_hf},
        "target": {"family": target.config.family, "layers": target.n_layers,
                   "hidden": target.config.hidden_size, "vocab": target.vocab_size,
                   "weight_bytes": decode_weight_bytes(target)},
    }

    def minispec_method(drafter, g):
        return lambda ids: generate(target, drafter, ids, sampling, request, gamma=g)

    with blas_threads(args.threads) as n_threads:
        report["settings"]["blas_threads"] = n_threads
        t1, tv = time_decode_steps([(target, 1), (target, gamma + 1)], context, steps)
        costs = {"context": context, "target_step_s": t1, "verify_s": tv,
                 # a step's weight products alone, of one row and of the verify call's rows
                 "target_matmul_s": time_matmuls(target, 1, steps),
                 "verify_matmul_s": time_matmuls(target, gamma + 1, steps),
                 # a token's arithmetic in a call of many, the weights in the cache
                 "arithmetic_per_token_s": arithmetic_per_token(target, repeats=steps),
                 # the floor: the bytes a step reads (as stored) at the best read of as many,
                 # timed before the generation passes and again after them (below)
                 "read_bandwidth": read_bandwidth(decode_weight_bytes(target),
                                                  2 if args.quick else 10, target.xp)}
        methods = {"minispec autoregressive": minispec_method(NoDrafter(target), 0)}
        for n in names:
            name, options = SELF_DRAFTERS[n]
            methods[f"minispec {n}"] = minispec_method(make_drafter(name, target, **options),
                                                       PRESET_GAMMA.get(n, gamma))
        if assistant is not None:  # its chain, and its chain ended by its confidence
            methods["minispec model"] = minispec_method(
                make_drafter("model", target, draft_model=assistant), gamma)
            methods["minispec model-stop"] = minispec_method(TunedModelDrafter(
                target, assistant, head_draft_vocab(target), MODEL_STOP), gamma)
        if use_hf:
            import torch

            torch.set_num_threads(args.threads)
            hf_target = _hf_load(args.target, args.device)
            costs["hf_target_step_s"], costs["hf_verify_s"] = hf_time_decode_steps(
                torch, [(hf_target, 1), (hf_target, gamma + 1)], context, steps)
            kw = {"max_new": args.max_new_tokens, "temperature": args.temperature,
                  "eos": benchmark_eos(target)}
            methods["hf generate"] = _hf_generator(torch, hf_target, **kw)
            methods["hf prompt lookup"] = _hf_generator(torch, hf_target, prompt_lookup=gamma,
                                                        **kw)
            if assistant is not None:  # as _hf_load_pair: gamma tokens a round, and the defaults
                fixed = _draft_exactly(_hf_load(args.assistant, args.device), gamma)
                methods["hf assisted"] = _hf_generator(torch, hf_target, assistant=fixed, **kw)
                methods["hf assisted (hf defaults)"] = _hf_generator(
                    torch, hf_target, assistant=_hf_load(args.assistant, args.device), **kw)
        timed = harness.time_methods(methods, prompts, args.repeats,
                                     warmup=not args.quick)
        costs["read_bandwidth"] = max(costs["read_bandwidth"], read_bandwidth(
            decode_weight_bytes(target), 2 if args.quick else 10, target.xp))
    report["costs"] = costs
    base = timed["minispec autoregressive"]
    report["generation"] = {
        name: {"tokens_per_second": m["tokens_per_second"], "new_tokens": m["new_tokens"],
               "seconds": m["seconds"],
               "speedup": m["tokens_per_second"] / base["tokens_per_second"],
               "tokens_per_target_call": (m["stats"]["new_tokens"] / m["stats"]["target_calls"]
                                          if "stats" in m else None),
               "alpha": m["stats"]["alpha"] if "stats" in m else None,
               # after each prompt's first round (its prefill): None for transformers' methods
               "decode_tokens_per_second": m.get("decode_tokens_per_second"),
               # None where there was no decode phase to compare (every answer ended in its
               # first round: a one-token answer, an EOS at once)
               "decode_speedup": (m["decode_tokens_per_second"]
                                  / base["decode_tokens_per_second"]
                                  if "decode_tokens_per_second" in m
                                  and base["decode_tokens_per_second"] > 0 else None)}
        for name, m in timed.items()}
    floor = decode_weight_bytes(target) / costs["read_bandwidth"]
    report["floor"] = {"weight_bytes": decode_weight_bytes(target),
                       "bandwidth": costs["read_bandwidth"], "floor_step_s": floor,
                       "products_bandwidth": decode_weight_bytes(target)
                       / costs["target_matmul_s"],
                       "step_fraction_of_floor": floor / costs["target_step_s"],
                       "arithmetic_per_token_s": costs["arithmetic_per_token_s"],
                       "autoregressive_fraction_of_floor":
                       floor * base["decode_tokens_per_second"]}
    agreement = {}
    if args.temperature == 0:
        pairs = [(name, "minispec autoregressive") for name in timed
                 if name != "minispec autoregressive"]
        for a, b in pairs:
            agreement[f"{a} vs {b}"] = _agreement(timed[a]["outputs"], timed[b]["outputs"])
    report["greedy_agreement"] = agreement
    return report


def format_without_draft(report: dict) -> str:
    """run_without_draft's report as a table for people."""
    m, s, c, t = report["machine"], report["settings"], report["costs"], report["target"]
    ms = 1e3
    load_avg = " ".join(f"{x:.2f}" for x in m["load_average"]) if m.get("load_average") else "?"
    lines = [
        f"minispec bench --draft none  {report['date']}",
        f"machine    {m['cpu']}, {m['cores']} cores, load average {load_avg} at start",
        f"threads    BLAS {s['blas_threads']} (numpy and torch)",
        f"products   {s['weight_products']}",
        (f"target     {s['target']}  {t['family']} L={t['layers']} D={t['hidden']} "
         f"V={t['vocab']}, {t['weight_bytes'] / 1e6:.1f} MB of weights per decode step"),
        *([f"assistant  {s['assistant']} (minispec model, hf assisted)"]
          if s.get("assistant") else []),
        (f"prompts    {s['num_prompts']} of {s['prompt_tokens'][0]}-{s['prompt_tokens'][1]} "
         f"tokens, max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}, "
         f"gamma {s['gamma']} (prompt lookup: prompt_lookup_num_tokens {s['gamma']})"),
        (f"timing     {s['warmup']} warm-up run per method, {s['repeats']} timed passes "
         "(methods interleaved), medians"),
        "",
        (f"target decode step {c['target_step_s'] * ms:.2f} ms, a verify call of "
         f"{s['gamma'] + 1} tokens {c['verify_s'] * ms:.2f} ms "
         f"({c['verify_s'] / c['target_step_s']:.2f}x), on a cache of {c['context']} positions"),
    ]
    fl = report.get("floor")
    if fl is not None:
        lines.append(
            f"memory floor {fl['weight_bytes'] / 1e6:.1f} MB of weights (as stored) / "
            f"{fl['bandwidth'] / 1e9:.1f} GB/s (best read of as many bytes) = "
            f"{fl['floor_step_s'] * ms:.2f} ms: the decode step at "
            f"{fl['step_fraction_of_floor']:.0%} of the floor's speed, autoregressive decoding "
            f"at {fl['autoregressive_fraction_of_floor']:.0%} (its decode loop)")
    if fl is not None and "target_matmul_s" in c:
        lines.append(
            f"  its weight products alone {c['target_matmul_s'] * ms:.2f} ms, reading "
            f"{fl['products_bandwidth'] / 1e9:.1f} GB/s "
            f"({fl['products_bandwidth'] / fl['bandwidth']:.0%} of the read test's); with "
            f"{s['gamma'] + 1} tokens {c['verify_matmul_s'] * ms:.2f} ms "
            f"({c['verify_matmul_s'] / c['target_matmul_s']:.2f}x)")
        lines += _arithmetic_lines(fl)
    if "hf_target_step_s" in c:
        lines.append(f"  transformers (torch): decode step {c['hf_target_step_s'] * ms:.2f} ms, "
                     f"verify call {c['hf_verify_s'] * ms:.2f} ms "
                     f"({c['hf_verify_s'] / c['hf_target_step_s']:.2f}x)")
    lines += ["", "generation (new tokens only; decode: after each prompt's first round, which "
              "holds its prefill)",
              f"  {'method':<26} {'tok/s':>8} {'tokens':>7} {'tok/call':>8} {'speedup':>8} "
              f"{'decode':>8} {'speedup':>8}"]
    for name, row in report["generation"].items():
        per_call, rate = row["tokens_per_target_call"], row.get("decode_tokens_per_second")
        ratio = row.get("decode_speedup")
        decode = ("-" if rate is None else f"{rate:.1f}",
                  "-" if ratio is None else f"{ratio:.2f}x")
        lines.append(f"  {name:<26} {row['tokens_per_second']:8.1f} {row['new_tokens']:7d} "
                     f"{'-' if per_call is None else f'{per_call:.2f}':>8} "
                     f"{row['speedup']:7.2f}x {decode[0]:>8} {decode[1]:>8}")
    lines += _agreement_lines(report["greedy_agreement"], "greedy outputs (T = 0)")
    return "\n".join(lines)


def _arithmetic_lines(fl: dict) -> list[str]:
    """The floor's companion: the arithmetic a token costs in a call of many (None off the CPU),
    and how many tokens one step's reading of the weights pays for."""
    a = fl.get("arithmetic_per_token_s")
    if a is None:
        return []
    return [f"  arithmetic alone {a * 1e3:.3f} ms a token (the products of 8 tokens in "
            f"one call, each matrix cut to what the L2 cache holds): a call of k tokens takes "
            f"at least k x that; the floor's reading pays for "
            f"{fl['floor_step_s'] / a:.1f} tokens' arithmetic"]


def _agreement_lines(agreement: dict, heading: str = "greedy outputs") -> list[str]:
    """The greedy agreement checks (_agreement's), one line each, under `heading`."""
    lines = ["", heading] if agreement else []
    for key, a in agreement.items():
        where = ", ".join(f"prompt {d['prompt']} from token {d['first_difference_at']}"
                          for d in a["differences"][:5])
        lines.append(f"  {key}: {a['identical']}/{a['total']} identical"
                     + (f" (differ: {where})" if where else ""))
    return lines


def _products(model) -> str:
    if kernel_in_use(model):
        import numba

        fast = getattr(model, "fast_steps", None)
        calls = ("every call on a cache" if getattr(fast, "max_tokens", 0) > MAX_TOKENS
                 else f"calls of 1..{MAX_TOKENS} tokens")
        steps = (f"; {calls}: minispec/cpu_steps.py's numba loops" if fast is not None
                 else "; every call: model.py's plain path (--fast-steps off)")
        mats = [model.weights["lm_head"]] + [layer.get(n) for layer in model.weights["layers"]
                                             for n in harness.PRODUCTS]
        blocks, int8 = sum(map(kept_as_blocks, mats)), sum(map(kept_for_int8, mats))
        kept = (f" ({blocks} matrices read as their GGUF blocks"
                + (f", {int8} of them multiplying int8 activations" if int8 else "") + ")"
                if blocks else "")
        rows = ("every number of rows" if int8 == len(mats) else
                f"1..{KERNEL_MAX_ROWS} rows")
        asks = f"{one_row_ahead()} bytes" if one_row_ahead() else "nothing"
        hint = ("" if blocks == len(mats)  # passes of one row over float32 or 16-bit tiles only
                else f"; one row asks {asks} ahead (backend.tune_one_row's choice)")
        return (f"minispec's few-rows kernel for {rows} (numba {numba.__version__}){kept}"
                + ("" if int8 == len(mats) else ", else BLAS") + hint + steps)
    return "NumPy's x @ w" + ("" if kernel_available() or model.device != "cpu"
                              else " (numba is not installed: no few-rows kernel)")


def kernel_in_use(model) -> bool:
    """Whether `model`'s weight products of a few rows go through the few-rows kernel."""
    return model.device == "cpu" and kernel_available() and model.dtype == np.float32


def _step_costs(rounds: dict, samples: list[tuple], gamma: int) -> dict:
    """The costs: round_costs' medians (c, the verify call; the harness's definition, as in
    `minispec sweep`), and the medians of the samples taken beside them: the target call of k =
    1..16 tokens (with the kernel, and with NumPy's BLAS when the kernel is in use), the
    verify-cost curve t(k)/t(1) for k = 1..9 and the weight matmuls alone."""
    curves, matmuls = zip(*samples)
    steps = [median(col) for col in zip(*curves)]  # k = 1..16, then again for NumPy's BLAS
    mm = [median(col) for col in zip(*matmuls)]
    n = len(CURVE_KS)
    calls = {"minispec": dict(zip(CURVE_KS, steps[:n]))}
    if len(steps) > n:
        calls["minispec, NumPy BLAS"] = dict(zip(CURVE_KS, steps[n:]))
    return {"step_calls": rounds["rounds"], "cost_gamma": gamma,
            "target_step_s": rounds["target_step_s"], "draft_step_s": rounds["draft_step_s"],
            "c": rounds["c"], "verify_ratio": rounds["verify_ratio"],
            "target_matmul_s": mm[0], "target_matmul_s_k5": mm[1], "draft_matmul_s": mm[2],
            "verify_cost": {str(k): steps[k - 1] / steps[0] for k in range(1, 10)},
            "target_call_s": {name: {str(k): t for k, t in c.items()}
                              for name, c in calls.items()}}


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
    # the arithmetic of a token in a call of many, with the weights in the cache (8 rows)
    costs["arithmetic_per_token_s"] = arithmetic_per_token(target, repeats=3 if quick else 20)
    return costs


def _greedy_vocab_size(target, draft) -> int | None:
    """How many ids make_drafter("model") drafts from at T = 0 (its greedy vocabulary), or None."""
    from ..drafters import make_drafter

    head = make_drafter("model", target, draft_model=draft).greedy_head
    return None if head is None else head.size


def _methods(args, target, draft, gamma, eos, hf):
    """{name: generate(ids) -> result} for every method the run compares."""
    from ..core.speculative import Request, generate
    from ..drafters import NoDrafter, make_drafter

    sampling, request = Sampling(args.temperature), Request(args.max_new_tokens, eos, seed=0)
    plain, drafter = NoDrafter(target), make_drafter("model", target, draft_model=draft)
    methods = {
        "minispec autoregressive":
            lambda ids: generate(target, plain, ids, sampling, request, gamma=0),
        "minispec speculative":
            lambda ids: generate(target, drafter, ids, sampling, request, gamma=gamma),
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


def _derive(report: dict, gamma) -> None:
    """Add the theory, the comparisons, the agreement checks and the aims to `report`."""
    gen, costs = report["generation"], report["costs"]
    ar, sp = gen["minispec autoregressive"], gen["minispec speculative"]
    if not (ar["decode_tokens_per_second"] > 0 and sp["decode_tokens_per_second"] > 0):
        raise MinispecError("--max-new-tokens, --prompts: every generation ended in its first "
                            "round (one new token, or an EOS at once), so there is no decode "
                            "phase to time against the theory; give 2 or more new tokens and "
                            "prompts whose answers go on")
    st = sp["stats"]
    alpha = st["alpha"]
    g = gamma if gamma != "auto" else st["drafted"] / max(st["rounds_with_drafts"], 1)
    c = costs["c"]
    # Theorem 3.8 compares decode steps: the speedup of the decode phase, the prompt's prefill
    # (the same call for both) apart; the end-to-end one beside it
    speedup = sp["decode_tokens_per_second"] / ar["decode_tokens_per_second"]
    speedup_end_to_end = sp["tokens_per_second"] / ar["tokens_per_second"]
    predicted = predicted_speedup(alpha, g, c)
    verify_ratio = costs["verify_cost"].get(str(round(g) + 1))
    refined = (None if verify_ratio is None
               else predicted_speedup_measured_verify(alpha, g, c, verify_ratio))
    tokens_per_call = st["new_tokens"] / st["target_calls"]
    report["theory"] = {
        "alpha": alpha,
        "acceptance_rate": st["accepted"] / st["drafted"] if st["drafted"] else 0.0,
        "gamma": g, "c": c,
        "expected_tokens_per_call": expected_tokens_per_call(alpha, g),
        "tokens_per_target_call": tokens_per_call,
        "speedup": speedup, "speedup_end_to_end": speedup_end_to_end,
        "predicted_speedup": predicted,
        "speedup_over_predicted": speedup / predicted,
        "verify_ratio": verify_ratio, "predicted_speedup_measured_verify": refined,
        "speedup_over_predicted_measured_verify": None if refined is None else speedup / refined,
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
    ar_step_s = 1.0 / ar["decode_tokens_per_second"]  # the decode loop's, per token
    rest = ar_step_s - costs["target_matmul_s"]  # all but the weight products (see below)
    report["floor"] = {
        "weight_bytes": floor["weight_bytes"], "bandwidth": costs["bandwidth"]["read_weight_sized"],
        "floor_step_s": floor["floor_step_s"], "floor_tokens_per_second":
        floor["floor_tokens_per_s"], "autoregressive_step_s": ar_step_s,
        "autoregressive_step_s_end_to_end": ar["seconds"] / ar["new_tokens"],
        "autoregressive_fraction_of_floor": floor["floor_step_s"] / ar_step_s,
        "forward_fraction_of_floor": floor["floor_step_s"] / costs["target_step_s"],
        "floor_step_s_large": costs["floor_large"]["floor_step_s"],
        # the weight products of one step alone: the bytes they read (as stored) per second
        "products_bandwidth": floor["weight_bytes"] / costs["target_matmul_s"],
        "arithmetic_per_token_s": costs["arithmetic_per_token_s"],
        # what a decode loop's token costs besides the weight products: attention over the
        # cache, norms, RoPE, the head's warp and draw, the loop's Python
        "rest_of_step_s": rest,
        "rest_of_step_share": max(rest, 0.0) / ar_step_s,
    }
    loop = loop_costs(sp["decode_rounds"], ar["decode_rounds"])
    if loop is not None:  # the costs the loop paid: what remains of the gap is outside rounds
        loop["predicted_speedup"] = predicted_speedup_measured_verify(
            alpha, loop["gamma"], loop["c"], loop["verify_ratio"])
        loop["speedup_over_predicted"] = speedup / loop["predicted_speedup"]
    report["theory"]["loop"] = loop
    a = costs["arithmetic_per_token_s"]
    if a is not None and verify_ratio is not None:
        # the verify call at no less than its arithmetic: the theorem's speedup with that cost
        # (or one step's, if more), what a kernel that only paid for its arithmetic would reach
        least = max((round(g) + 1) * a / costs["target_step_s"], 1.0)
        report["theory"]["verify_ratio_arithmetic"] = least
        report["theory"]["predicted_speedup_arithmetic_verify"] = (
            predicted_speedup_measured_verify(alpha, g, c, least))
    calls = costs["target_call_s"]["minispec"]
    t5, t9 = calls["5"] / calls["1"], calls["9"] / calls["1"]
    aims = {
        "target call t(5)/t(1) <= 1.25": (t5, t5 <= 1.25),
        "target call t(9)/t(1) <= 1.5": (t9, t9 <= 1.5),
        "speculative >= 2.5x autoregressive (decode)": (speedup, speedup >= 2.5),
        "speculative >= 0.9 x Theorem 3.8": (speedup / predicted, speedup / predicted >= 0.9),
        "autoregressive decode >= 0.8 x memory floor": (
            report["floor"]["autoregressive_fraction_of_floor"],
            report["floor"]["autoregressive_fraction_of_floor"] >= 0.8),
        "the rest of a decode step <= 0.2 of it (all but the weight products)": (
            report["floor"]["rest_of_step_share"], report["floor"]["rest_of_step_share"] <= 0.2),
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
                f"{d['weight_bytes'] / 1e6:.1f} MB of weights (as stored) per decode step")

    lines = [
        f"minispec bench  {report['date']}",
        f"machine    {m['cpu']}, {m['cores']} cores, load average {load} at start",
        f"software   {', '.join(soft)}",
        f"threads    BLAS {s['blas_threads']} (numpy)"
        + (f", torch {s['torch_threads']}" if s["torch_threads"] else ""),
        f"device     {s['device']}, compute dtype {s['dtype']}",
        f"products   {s['weight_products']}",
        f"target     {model_line('target')}",
        f"draft      {model_line('draft')}",
        *([f"           at T = 0 its LM head over the target's greedy vocabulary alone: "
           f"{s['greedy_vocab']} ids (weights/greedy_vocab.json)"]
          if s.get("greedy_vocab") and s["temperature"] == 0 else []),
        (f"prompts    {s['prompts']}: {s['num_prompts']} prompts of "
         f"{s['prompt_tokens'][0]}-{s['prompt_tokens'][1]} tokens"),
        (f"decoding   max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}, "
         f"gamma {s['gamma']}"),
        (f"timing     1 warm-up run per method, {s['repeats']} timed passes (methods "
         f"interleaved), medians"),
        "",
        (f"costs (warm cache of {costs['context']} positions, the prompts' mean plus half the "
         f"new tokens; rounds of gamma = {costs['cost_gamma']} timed as the loop runs them, "
         f"medians of {costs['step_calls']} rounds taken between the timed passes)"),
        (f"  target decode step  {costs['target_step_s'] * ms:7.3f} ms   (its weight matmuls "
         f"alone {costs['target_matmul_s'] * ms:.3f} ms; with 5 tokens "
         f"{costs['target_matmul_s_k5'] * ms:.3f} ms)"),
        (f"  draft decode step   {costs['draft_step_s'] * ms:7.3f} ms   (its weight matmuls "
         f"alone {costs['draft_matmul_s'] * ms:.3f} ms)"),
        (f"  cost ratio c        {costs['c']:7.3f}   (draft step / target step)"),
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
    curves = dict(costs["target_call_s"])
    if "hf" in costs:
        curves["torch (transformers)"] = costs["hf"]["target_call_s"]
    lines.append("  target call of k tokens, ms (k = 1..16; at the memory floor a call of a few "
                 "tokens costs one token's)")
    for name, c in curves.items():
        t1 = c["1"]
        lines.append(f"    {name:<22} t(1) {t1 * ms:6.2f}  t(5) {c['5'] * ms:6.2f} "
                     f"({c['5'] / t1:.2f}x)  t(9) {c['9'] * ms:6.2f} ({c['9'] / t1:.2f}x)  "
                     f"t(16) {c['16'] * ms:6.2f} ({c['16'] / t1:.2f}x)")
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
        (f"  the weight products of a step read {fl['products_bandwidth'] / 1e9:.1f} GB/s "
         f"({fl['products_bandwidth'] / fl['bandwidth']:.0%} of the read test's)"),
        *_arithmetic_lines(fl),
        (f"  autoregressive decoding runs at {fl['autoregressive_fraction_of_floor']:.0%} of the "
         f"floor's speed ({fl['autoregressive_step_s'] * ms:.3f} ms/token in the decode loop; "
         f"the bare forward step at {fl['forward_fraction_of_floor']:.0%}; "
         f"{fl['autoregressive_step_s_end_to_end'] * ms:.3f} ms/token with the prompt's prefill)"),
        (f"  the rest of a decode step (attention, norms, RoPE, the head's warp and draw, the "
         f"loop's Python): {fl['rest_of_step_s'] * ms:.3f} ms, {fl['rest_of_step_share']:.0%} of "
         f"the loop's token; the draft step {costs['draft_step_s'] / costs['draft_matmul_s']:.2f}x"
         f" its weight products" + _draft_in_loop(th.get("loop"), costs["draft_matmul_s"])),
        "",
        "generation (new tokens only; decode: after each prompt's first round, which holds its "
        "prefill)",
        (f"  {'method':<28} {'tok/s':>8} {'tokens':>7} {'alpha':>6} {'tok/call':>8} "
         f"{'speedup':>8} {'decode':>8} {'speedup':>8}"),
    ]
    gen = report["generation"]
    base = gen["minispec autoregressive"]["tokens_per_second"]
    base_decode = gen["minispec autoregressive"]["decode_tokens_per_second"]
    for name, row in gen.items():
        st = row.get("stats")
        alpha = tok_call = "-"
        decode = ["-", "-"]
        if st and st["drafted"]:
            alpha = f"{st['alpha']:.3f}"
        if st:
            tok_call = f"{st['new_tokens'] / st['target_calls']:.2f}"
            rate = row["decode_tokens_per_second"]
            decode = [f"{rate:.1f}", f"{rate / base_decode:.2f}x"]
        lines.append(f"  {name:<28} {row['tokens_per_second']:8.1f} {row['new_tokens']:7d} "
                     f"{alpha:>6} {tok_call:>8} {row['tokens_per_second'] / base:7.2f}x "
                     f"{decode[0]:>8} {decode[1]:>8}")
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
        (f"  measured speedup {th['speedup']:.2f}x (decode; {th['speedup_end_to_end']:.2f}x with "
         f"the prefill) = {th['speedup_over_predicted']:.2f} of the prediction"),
    ]
    if th["verify_ratio"] is not None:
        lines.append(
            f"  with the verify call's measured cost t({round(th['gamma']) + 1})/t(1) = "
            f"{th['verify_ratio']:.2f} in place of 1: predicted "
            f"{th['predicted_speedup_measured_verify']:.2f}x, measured = "
            f"{th['speedup_over_predicted_measured_verify']:.2f} of it")
    if th.get("loop") is not None:
        lp = th["loop"]
        lines.append(
            f"  with the costs the decode loop paid (its rounds' own timers; a step "
            f"{lp['step_s'] * ms:.3f} ms): a round's target call, head and verify "
            f"{lp['verify_ratio']:.2f} steps, c = {lp['c']:.3f} a draft, g = {lp['gamma']:.2f}: "
            f"predicted {lp['predicted_speedup']:.2f}x, measured = "
            f"{lp['speedup_over_predicted']:.2f} of it")
    if th.get("verify_ratio_arithmetic") is not None:
        lines.append(
            f"  with the verify call at its arithmetic alone, "
            f"{th['verify_ratio_arithmetic']:.2f} decode steps: predicted "
            f"{th['predicted_speedup_arithmetic_verify']:.2f}x (what the kernel's "
            f"arithmetic leaves room for)")
    lines += _agreement_lines(report["greedy_agreement"])
    lines += ["", "aims"]
    for key, a in report["aims"].items():
        lines.append(f"  [{'met' if a['met'] else 'NOT met':>7}] {key}: {a['value']:.2f}")
    return "\n".join(lines)


def _draft_in_loop(loop: dict | None, products_s: float) -> str:
    """What a draft cost inside the decode loop (the drafter's own timer: its forward calls,
    warp, draw and Python), beside its weight products; "" without the loop's costs."""
    if loop is None:
        return ""
    draft = loop["c"] * loop["step_s"]
    return (f"; in the decode loop a draft {draft * 1e3:.3f} ms, {draft / products_s:.2f}x them "
            f"(the drafter's timer: its calls, warp, draw and Python)")


def plot(report: dict, path: str) -> str:
    """The verify-cost curves (a target call of k tokens, ms) beside the memory floor, written to
    `path`; a note instead if matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot: matplotlib is not installed, {path} not written"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .sweep import save

    costs, ms = report["costs"], 1e3
    curves = dict(costs["target_call_s"])
    if "hf" in costs:
        curves["torch (transformers)"] = costs["hf"]["target_call_s"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (name, c), style in zip(curves.items(), ("o-", "s--", "^:")):
        ks = [int(k) for k in c]
        ax.plot(ks, [t * ms for t in c.values()], style, label=name)
    ax.axhline(report["floor"]["floor_step_s"] * ms, color="grey", lw=1, ls="-.",
               label="memory floor (weight bytes / bandwidth)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("k, tokens in one target call")
    ax.set_ylabel("time of the call (ms)")
    m = report["models"]["target"]
    n = report["settings"]["blas_threads"] or "?"
    ax.set_title(f"Verify cost: target L={m['layers']} D={m['hidden']} V={m['vocab']}, "
                 f"{n} thread{'' if n == 1 else 's'}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    """`minispec bench [options]`: run the benchmark, print a table (or JSON with --json)."""
    args = build_parser().parse_args(argv)
    args.gamma = parse_gamma(args.gamma)
    if args.plot and not os.path.isdir(os.path.dirname(args.plot) or "."):
        raise MinispecError(f"--plot {args.plot}: the folder "
                            f"{os.path.dirname(args.plot)} does not exist")
    alone = args.draft.lower() == "none"
    if args.drafters is not None and not alone:
        raise MinispecError("--drafters: only with --draft none (with a draft model the bench "
                            "runs that model's chain)")
    if args.assistant is not None and not alone:
        raise MinispecError("--assistant: only with --draft none (with a draft, the draft is "
                            "transformers' assistant already)")
    if not alone:
        args.draft = path_arg(args.draft)  # "shipped:draft" or a directory
    if alone and args.plot:
        raise MinispecError("--plot: draws the pair's verify-cost curves; not with --draft none")
    report = run_without_draft(args) if alone else run(args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print((format_without_draft if alone else format_report)(report))
    if args.plot:  # after --json, the note goes to stderr: stdout stays valid JSON
        print(plot(report, args.plot), file=sys.stderr if args.json else sys.stdout)
    return 0
