"""Benchmarks that tell the truth: measured speedup next to what the theory predicts.

Leviathan et al. 2023 (section 3.4, Theorem 3.8) predict the walltime improvement of speculative
decoding from two numbers: alpha, the expected acceptance rate of a draft token, and c, the cost
of one draft call relative to one target call. With gamma drafts per round, a round emits
(1 - alpha^(gamma+1)) / (1 - alpha) tokens on average (Equation 1) and costs gamma*c + 1 target
calls, if checking gamma + 1 tokens in one target call costs what generating one does. This
module measures each of those quantities on its own (alpha, c, the verify-cost curve
t(k tokens)/t(1 token), the memory-bound floor of a decode step) and the end-to-end speed, so a
report can say where theory and measurement agree and where they part.

The measurement helpers (predicted_speedup, cost_ratio, time_decode_step, ...) are public: the
sweep (minispec/sweep.py) reuses them.

BLAS threads: on a small shared CPU, multi-threaded OpenBLAS makes decode-sized matmuls
(one row times a [D, F] matrix) many times slower than a single thread, because the threads wait
for each other on every call. The benchmark therefore pins the BLAS pool (`blas_threads`) for the
whole run, 1 thread by default, and reports the thread count in its header.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

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


def _check_alpha_gamma(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise MinispecError(f"alpha: expected an acceptance rate in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 0:
        raise MinispecError(f"gamma: expected an integer >= 0, got {gamma!r}")


# ---------------------------------------------------------------------------------------------
# BLAS threads


def _openblas() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) for the OpenBLAS that NumPy loaded, found through ctypes (Linux), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in [("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")]:
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                set_.argtypes = [ctypes.c_int]
                return get, set_
    return None


def get_blas_threads() -> int | None:
    """Threads NumPy's BLAS uses now, or None when this cannot be found out."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        lib = _openblas()
        return None if lib is None else int(lib[0]())
    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(counts) if counts else None


def set_blas_threads(n: int) -> int | None:
    """Set NumPy's BLAS thread count (threadpoolctl if installed, else OpenBLAS through ctypes).

    Returns the previous count, or None when the BLAS cannot be controlled (then nothing changes).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise MinispecError(f"threads: expected an integer >= 1, got {n!r}")
    before = get_blas_threads()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        lib = _openblas()
        if lib is None:
            return None
        lib[1](n)
        return before
    threadpool_limits(n, user_api="blas")
    return before


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[int | None]:
    """Run a block with NumPy's BLAS on n threads; yields the count in effect (None: unknown)."""
    before = set_blas_threads(n)
    try:
        yield get_blas_threads()
    finally:
        if before is not None:
            set_blas_threads(before)


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


def time_decode_step(model, k: int = 1, context: int = 64, repeats: int = 20,
                     warmup: int = 3) -> float:
    """Median seconds of one `forward` of k tokens on a warm cache holding `context` positions.

    The same k tokens are fed and rolled back each time, so every call sees the same cache length:
    k = 1 is a decode step, k = gamma + 1 is a verify call.
    """
    if k < 1 or context < 1:
        raise MinispecError(f"time_decode_step: need k >= 1 and context >= 1, got {k}, {context}")
    ids = (np.arange(context + k) % min(model.vocab_size, 256)).tolist()
    cache = model.new_cache(context + k)
    model.forward(ids[:context], cache)  # the prefill: a warm cache of `context` positions
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        model.forward(ids[context:], cache)
        _sync(model)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        cache.rollback(context)
    return median(times)


def cost_ratio(target, draft, context: int = 64, repeats: int = 20) -> dict[str, float]:
    """c of Theorem 3.8: median draft decode step / median target decode step (one token, warm
    cache of `context` positions). Returns {"c", "draft_step_s", "target_step_s"}."""
    t_draft = time_decode_step(draft, 1, context, repeats)
    t_target = time_decode_step(target, 1, context, repeats)
    return {"c": t_draft / t_target, "draft_step_s": t_draft, "target_step_s": t_target}


def verify_cost_curve(model, ks: Sequence[int] = range(1, 10), context: int = 64,
                      repeats: int = 20) -> dict[int, float]:
    """{k: t(k tokens in one call) / t(1 token)}: how much checking k tokens costs over one."""
    times = {k: time_decode_step(model, k, context, repeats) for k in ks}
    t1 = times[1] if 1 in times else time_decode_step(model, 1, context, repeats)
    return {k: t / t1 for k, t in times.items()}


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


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s from a large NumPy copy: bytes read / median seconds.

    Convention: a copy of n bytes reads n and writes n; we count the n bytes read, which is what a
    decode step does with its weights (reads them once, writes little).
    """
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return src.nbytes / median(times)


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
