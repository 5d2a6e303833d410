"""One timing harness: every speed figure minispec prints is measured here, the same way.

`minispec bench`, `minispec sweep` and the READMEs' tables all take their numbers from these
functions, so one quantity has one definition:

  alpha     Leviathan et al.'s per-token acceptance probability, estimated as accepted /
            (accepted + rejections): drafts after a round's first rejection are never tested,
            so accepted / drafted ("acceptance rate") understates it for gamma > 1.
  c         the cost of one draft step over one target step (Theorem 3.8), both timed as the
            loops run them (`round_costs`): rounds of gamma one-token draft steps in a row,
            then the target's verify call of gamma + 1 tokens; one-token target steps in a row.
  verify    t(gamma + 1 tokens in one target call) / t(1 token), from the same rounds.
  in loop   the same two costs as the decode loop paid them, from its rounds' own timers
            (`loop_costs`): what is left of the gap to the theorem lies outside the rounds.
  speedup   tokens/s of speculative over autoregressive decoding on the same prompts with the
            same settings, methods timed pass by pass in turn (`time_methods`).
  EOS       generation stops at the target's EOS ids from its config, as a user's would
            (`benchmark_eos`); every method sees the same stopping rule.

Leviathan et al. 2023 (section 3.4, Theorem 3.8) predict the walltime improvement from alpha and
c: a round emits (1 - alpha^(gamma+1)) / (1 - alpha) tokens on average (Equation 1) and costs
gamma*c + 1 target calls, if checking gamma + 1 tokens costs what generating one does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..backend import (
    get_blas_threads,
    kept_as_blocks,
    kernel_weight,
    product_for,
    set_blas_threads,
    stored_bytes,
)
from ..core.speculative import expected_tokens_per_call  # Equation 1, in the core: batch.py uses it
from ..cpu_steps import PRODUCTS  # a layer's weight matrices, in order
from ..errors import MinispecError
from ..kernels import LANES

# ---------------------------------------------------------------------------------------------
# the theory (Leviathan et al. 2023, section 3)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8, the expected walltime improvement:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

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


def per_token_alpha(results) -> float:
    """alpha = accepted / (accepted + rejections) over every round of `results`
    (GenerationResults); 1.0 when drafts were made and none rejected, 0.0 when nothing was
    drafted. A rejection is a round that kept fewer positions than it drafted (its depth)."""
    rounds = [r for res in results for r in res.stats.rounds if r.drafted]
    accepted = sum(r.accepted for r in rounds)
    rejections = sum(r.accepted < r.depth for r in rounds)
    return accepted / (accepted + rejections) if rounds else 0.0


def benchmark_eos(target) -> list[int] | None:
    """The EOS policy of every benchmark: stop at the target's EOS ids, as a user would."""
    return list(target.config.eos_token_ids) or None


# ---------------------------------------------------------------------------------------------
# prompts


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Prompt texts from a file: JSON {"prompts": [{"text": ...} | "text", ...]} (the format of
    weights/prompts.json) or a JSON list of the same; any other file is one prompt per line.

    limit: keep the first `limit` prompts (None or 0: all).
    """
    path = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise MinispecError(f"--num-prompts: expected an integer >= 0 (0: all), got {limit!r}")
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MinispecError(f"{path}: cannot read the prompt file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise MinispecError(f"{path}: not a text file (expected UTF-8; byte {e.start} is "
                            f"0x{e.object[e.start]:02x})") from None
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


def synthetic_prompts(vocab_size: int, n: int, length: int = 32, seed: int = 0
                      ) -> list[list[int]]:
    """n prompts of random token ids, for models without a tokenizer (random test models)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, length).tolist() for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# timing primitives


def progress(message: str) -> None:
    """Where a long measurement is, on stderr when it is a terminal (quiet when piped or
    redirected, as under --json in scripts and CI)."""
    if sys.stderr.isatty():
        print(f"  ... {message}", file=sys.stderr, flush=True)


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
    from ..core.model import linear

    xp, w = model.xp, model.weights
    mats = [layer[n] for layer in w["layers"] for n in PRODUCTS if layer.get(n) is not None]
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


def arithmetic_per_token(model, rows: int = 8, cut_bytes: int = 2**18, repeats: int = 20
                         ) -> float | None:
    """Seconds of weight-product arithmetic per token in a call of many tokens, with the weights
    in the cache: each of a step's matrices cut to its first outputs (about cut_bytes, which the
    CPU's L2 cache holds), multiplied by `rows` rows of ones through model.py's `linear` (the
    block product, or the int8 one, of its first tiles, for a matrix read as GGUF blocks), its
    best time scaled to the whole matrix and divided by `rows`. A call of k tokens takes at least
    k times this, as it takes at least the memory floor: past k = floor / this, a verify call is
    bound by its arithmetic, not by reading the weights. None off the CPU."""
    from ..core.model import linear

    if model.xp is not np:
        return None
    w = model.weights
    mats = [(w["layers"][0][n], model.n_layers) for n in PRODUCTS
            if w["layers"][0].get(n) is not None] + [(w["lm_head"], 1)]
    total = 0.0
    for m, count in mats:
        d_in, d_out = m.shape
        x = np.ones((rows, d_in), dtype=model.dtype)
        if kept_as_blocks(m):  # read as GGUF blocks: the block product on the first tiles
            tiles = kernel_weight(m)  # [ceil(D_out / 64), D_in / 32, bytes]
            n_tiles = max(1, min(tiles.shape[0], cut_bytes // tiles[0].nbytes))
            cut, n = tiles[:n_tiles], n_tiles * LANES
            product = product_for(tiles)  # the block product, or the int8 one
            y = np.empty((rows, n), np.float32)

            def call(x=x, cut=cut, y=y, product=product):
                product(x, cut, y)
        else:
            n = max(1, min(d_out, cut_bytes // (d_in * m.dtype.itemsize)))
            n -= n % LANES if n > LANES else 0  # whole tiles of the kernel's outputs
            cut = m[:, :n]

            def call(x=x, cut=cut):
                linear(x, cut)
        best = float("inf")
        for _ in range(repeats + 1):  # the first fills the cache
            t0 = time.perf_counter()
            for _ in range(10):
                call()
            best = min(best, (time.perf_counter() - t0) / 10)
        total += best * (d_out / n) * count
    return total / rows


def verify_cost_curve(model, ks: Sequence[int] = range(1, 10), context: int = 64,
                      repeats: int = 20) -> dict[int, float]:
    """{k: t(k tokens in one call) / t(1 token)}: how much checking k tokens costs over one."""
    timed = sorted({1, *ks})
    times = dict(zip(timed, time_decode_steps([(model, k) for k in timed], context, repeats)))
    return {k: times[k] / times[1] for k in ks}


class FirstLayers:
    """A model's first `layers` layers, then its final norm and head, as a model for the timing
    functions (the early-exit drafter's step: Drafter.draft_step says which model and layers)."""

    def __init__(self, model, layers: int) -> None:
        self.model, self.layers = model, layers
        self.vocab_size, self.device, self.xp = model.vocab_size, model.device, model.xp

    def new_cache(self, max_len: int | None = None):
        return self.model.new_cache(max_len)

    def forward(self, tokens, cache):
        m, pos = self.model, cache.length
        h = m.run_layers(m.embed(tokens, pos), cache, pos, 0, self.layers)  # [T, D]
        cache.length = pos + h.shape[0]
        return m.lm_head(h[-1:])  # [1, V]: the row a draft is sampled from


def draft_step_model(drafter, target=None, draft_model=None, exit_layer: int | None = None):
    """What one draft step runs, as a model to time, asked of the drafter (a Drafter, or a
    name for make_drafter with these arguments): a model, its first layers (FirstLayers), or
    None for a drafter without a forward call (the n-gram lookup)."""
    from ..batch import draft_step
    from ..drafters import Drafter, make_drafter

    if not isinstance(drafter, Drafter):
        drafter = make_drafter(drafter, target, draft_model=draft_model, exit_layer=exit_layer)
    step = draft_step(drafter)
    if step is None:
        return None
    model, layers = step
    return model if layers is None else FirstLayers(model, layers)


def round_costs(target, draft, gamma: int, context: int = 64, repeats: int = 20,
                warmup: int = 3) -> dict[str, float]:
    """The costs of a round, timed in the loops' orders: speculative rounds, each gamma one-token
    draft steps in a row then the target's verify call of gamma + 1 tokens (the target's weights
    as cold as the drafting leaves them), then as many one-token target steps in a row (as
    autoregressive decoding runs them). Caches are rolled back after each call, so every round
    sees `context` positions.

    draft: a model-like object (forward/new_cache) or None (no draft forward: c = 0).
    Returns {"target_step_s", "draft_step_s", "verify_s", "c", "verify_ratio"}: medians over
    `repeats` rounds (a round's draft step is the mean of its gamma steps); c = draft step /
    target step, verify_ratio = verify call / target step.
    """
    if gamma < 1 or context < 1:
        raise MinispecError(f"round_costs: need gamma >= 1 and context >= 1, got {gamma}, "
                            f"{context}")
    ids = (np.arange(context + gamma + 1) % min(target.vocab_size, 256)).tolist()
    tc = target.new_cache(context + gamma + 1)
    target.forward(ids[:context], tc)
    dc = None
    if draft is not None:
        dc = draft.new_cache(context + gamma)
        draft.forward(ids[:context], dc)

    def timed(model, tokens, cache) -> float:
        t0 = time.perf_counter()
        model.forward(tokens, cache)
        _sync(model)
        cache.rollback(context)
        return time.perf_counter() - t0

    drafts, verifies = [], []
    for i in range(warmup + repeats):
        t_draft = sum(timed(draft, [ids[context + j]], dc)
                      for j in range(gamma if dc is not None else 0))
        t_verify = timed(target, ids[context:context + gamma + 1], tc)
        if i >= warmup:
            drafts.append(t_draft / gamma)
            verifies.append(t_verify)
    steps = [timed(target, ids[context:context + 1], tc) for _ in range(warmup + repeats)]
    step, draft_step, verify = median(steps[warmup:]), median(drafts), median(verifies)
    return {"target_step_s": step, "draft_step_s": draft_step, "verify_s": verify,
            "c": draft_step / step, "verify_ratio": verify / step}


COST_ROUNDS = 8  # rounds timed by round_costs between two timed passes


def typical_context(prompts, max_new_tokens: int) -> int:
    """The cache length a run's steps see on average: the mean prompt plus half the new tokens
    (the costs are timed there: a call's attention grows with it, a verify call's k rows k
    times as fast; the shipped target's layers, 5 tokens against 1 on an AVX-512 Xeon guest,
    2026-12-06: 1.21x at 50 positions, 1.29x at 100, 1.52x at 200)."""
    return int(np.mean([len(p) for p in prompts])) + max_new_tokens // 2


def check_room(target, prompts, max_new_tokens: int, gammas=(), source: str = "the prompts",
               flag: str = "--gamma") -> None:
    """Before anything is timed: the context the costs are timed at (typical_context) has room
    for a step and for a verify call of gamma + 1 tokens in the target's context length, else
    MinispecError naming the flag. The timing helpers allocate caches of those lengths, so a
    huge value would ask for gigabytes before any generation refused it (a generation itself
    stops where the context ends)."""
    limit = target.config.max_position_embeddings
    longest = max(len(p) for p in prompts)
    if longest >= limit:
        raise MinispecError(f"{source}: a prompt of {longest} tokens leaves no room for new "
                            f"tokens in the target's context length, {limit} "
                            "(max_position_embeddings)")
    context = typical_context(prompts, max_new_tokens)
    if context + 1 > limit:
        raise MinispecError(f"--max-new-tokens {max_new_tokens}: the costs are timed at the mean "
                            f"prompt of {source} plus half the new tokens, {context} positions, "
                            f"past the target's context length, {limit} "
                            "(max_position_embeddings)")
    for g in gammas:
        if isinstance(g, int) and context + g + 1 > limit:
            raise MinispecError(f"{flag} {g}: a verify call of {g + 1} tokens after the "
                                f"{context} positions the costs are timed at passes the "
                                f"target's context length, {limit}")


def time_speed_and_costs(methods: dict, prompts, repeats: int, target, draft, gamma: int,
                         context: int, between=None) -> tuple[dict, dict]:
    """The measurement bench and sweep share: `time_methods` over the prompts, with
    `round_costs` (COST_ROUNDS rounds at `context` positions, `typical_context`) taken before
    each round of passes and after the last, so costs and speeds are measured under the same
    load.

    Returns (time_methods' result, the median of each round_costs field over the samples, plus
    "rounds": how many rounds the medians cover, and "context": the positions they were timed
    at). between(): anything else to time there.
    """
    samples = []
    context = min(context, target.config.max_position_embeddings // 2)  # tiny test models

    def sample():
        samples.append(round_costs(target, draft, gamma, context, COST_ROUNDS))
        if between is not None:
            between()

    timed = time_methods(methods, prompts, repeats, sample)
    sample()
    costs = {k: median([s[k] for s in samples]) for k in samples[0]}
    costs["rounds"], costs["context"] = COST_ROUNDS * len(samples), context
    return timed, costs


def time_methods(methods: dict, prompts, repeats: int, between=None, warmup=True) -> dict:
    """Warm each method up on one prompt (unless warmup is False), then time `repeats` passes
    over all prompts, the methods interleaved pass by pass so that a noisy neighbour slows them
    all alike; between() (if given) runs before each round of passes.

    methods: {name: generate(prompt ids) -> result with .tokens (and .stats, optional)}.
    Returns {name: {"seconds" (median per pass), "pass_seconds", "new_tokens",
    "tokens_per_second", "outputs", "results" (the last pass's), "stats" (summed, if any)}}.
    """
    for generate in methods.values() if warmup else ():
        generate(list(prompts[0]))
    passes: dict[str, list[float]] = {name: [] for name in methods}
    last: dict[str, list] = {}
    for i in range(repeats):
        if between is not None:
            between()
        progress(f"timed pass {i + 1}/{repeats} over {len(prompts)} prompts: "
                 f"{', '.join(methods)}")
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
               "outputs": [list(r.tokens) for r in results], "results": results}
        if hasattr(results[0], "stats"):
            row["stats"] = sum_stats(results)
            row["decode_tokens_per_second"] = decode_rate(results)
            row["decode_rounds"] = decode_rounds(results)
        out[name] = row
    return out


def decode_rate(results) -> float:
    """New tokens per second of the decode phase: each generation's tokens and time after its
    first round, which holds the prompt's prefill (a compute-bound call of the whole prompt,
    the same for every method) and the first token. From one pass's GenerationResults."""
    tokens = seconds = 0.0
    for r in results:
        if r.stats.rounds:
            first = r.stats.rounds[0]
            tokens += len(r.tokens) - len(first.emitted)
            seconds += r.stats.total_seconds - first.draft_seconds - first.verify_seconds
    return tokens / seconds if seconds > 0 else 0.0


def decode_rounds(results) -> dict:
    """The decode phase's rounds as the loop timed them (Round.draft_seconds, .verify_seconds:
    the drafter's propose; the target call, the head, verify and accept), summed over every
    round after each generation's first: {"rounds", "positions" (drafted), "emitted",
    "draft_seconds", "verify_seconds"}. From one pass's GenerationResults."""
    rounds = [rd for r in results for rd in r.stats.rounds[1:]]
    return {"rounds": len(rounds), "positions": sum(rd.depth for rd in rounds),
            "emitted": sum(len(rd.emitted) for rd in rounds),
            "draft_seconds": sum(rd.draft_seconds for rd in rounds),
            "verify_seconds": sum(rd.verify_seconds for rd in rounds)}


def loop_costs(speculative: dict, autoregressive: dict) -> dict | None:
    """The costs of a round as the decode loop paid them, in decode steps as the loop paid them
    (an autoregressive round's verify_seconds: the target's step, its head and draw), from two
    `decode_rounds`: {"step_s", "verify_ratio" (a speculative round's target call, head and
    verify / a step), "c" (a draft position's share of propose / a step), "gamma" (positions
    drafted a round)}; None without decode rounds on either side.

    round_costs times the same calls back to back; where a verify call costs more in the loop
    than there, the weights went colder while the drafter ran (see docs/benchmarks.md)."""
    if not (speculative["rounds"] and autoregressive["rounds"] and speculative["positions"]):
        return None
    step = autoregressive["verify_seconds"] / autoregressive["rounds"]
    if step <= 0:
        return None
    n = speculative["rounds"]
    return {"step_s": step, "verify_ratio": speculative["verify_seconds"] / n / step,
            "c": speculative["draft_seconds"] / speculative["positions"] / step,
            "gamma": speculative["positions"] / n}


def sum_stats(results) -> dict:
    """Counters summed over GenerationResults, with alpha (per_token_alpha) and the counts it
    comes from."""
    keys = ("new_tokens", "drafted", "positions", "accepted", "target_calls", "draft_calls",
            "draft_seconds", "verify_seconds", "total_seconds")
    total = {k: sum(getattr(r.stats, k) for r in results) for k in keys}
    total["rejections"] = sum(1 for r in results for rd in r.stats.rounds
                              if rd.drafted and rd.accepted < rd.depth)
    total["rounds_with_drafts"] = sum(1 for r in results for rd in r.stats.rounds if rd.drafted)
    total["alpha"] = per_token_alpha(results)
    return total


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
    """Bytes of weights one decode step reads: every matrix as held (all layers and the LM head,
    in the compute dtype, 16-bit as stored, or as its GGUF blocks: backend.stored_bytes; of the
    embedding only one row, which is negligible and not counted)."""
    w = model.weights
    seen, total = set(), 0
    arrays = [w["lm_head"], w["norm_w"]] + [a for layer in w["layers"] for a in layer.values()]
    for a in arrays:
        if a is None or id(a) in seen:
            continue
        seen.add(id(a))
        total += stored_bytes(a)
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
    """CPU model (with its widest vector unit where /proc/cpuinfo says: the few-rows kernel's
    speed turns on AVX-512 against AVX2), cores, load average and library versions, for the
    report header."""
    import os
    import platform

    from .. import __version__

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        flags = next((line.split(":", 1)[1].split() for line in lines
                      if line.startswith("flags")), [])
        cpu = names[0] if names else cpu
        simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
        cpu = f"{cpu} ({simd})" if simd else cpu
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
