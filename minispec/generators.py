"""Whole generation pipelines behind one signature, for the judge's `--generator`.

A generator factory takes the two model directories the judge writes, `factory(target_dir,
draft_dir)`, and returns `generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p,
seed) -> list[int]` (the new token ids). The judge calls it thousands of times and compares
the distribution of what comes out with the target's exact law. minispec's own pipelines are
here; transformers' are in minispec/hf_generators.py (they need torch and transformers):

    python -m minispec judge --generator minispec.generators:speculative
    python -m minispec judge --generator minispec.hf_generators:assisted
"""

from __future__ import annotations

from collections.abc import Callable

from .core.speculative import autoregressive_generate, speculative_generate
from .drafters import make_drafter
from .loader import load

Generate = Callable[..., list]
GAMMA = 3  # drafts per round of minispec's speculative generators


def _speculative(target_dir, draft_dir, drafter: str, device: str = "cpu") -> Generate:
    target = load(target_dir, device=device)
    draft = load(draft_dir, device=device) if drafter == "model" else None
    from .cpu_steps import enable_where_supported  # CUDA graphs on a GPU, numba loops on a CPU

    enable_where_supported(target, draft)

    def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        d = make_drafter(drafter, target, draft_model=draft)
        return speculative_generate(target, d, prompt_ids, gamma=GAMMA,
                                    max_new_tokens=max_new_tokens, temperature=temperature,
                                    top_k=top_k, top_p=top_p, seed=seed).tokens

    return generate


def speculative(target_dir, draft_dir) -> Generate:
    """minispec's speculative_generate with the draft model (gamma 3)."""
    return _speculative(target_dir, draft_dir, "model")


def speculative_gpu(target_dir, draft_dir) -> Generate:
    """The same on the GPU (CuPy), with CUDA graphs: the judge checks the GPU's speed path."""
    return _speculative(target_dir, draft_dir, "model", device="gpu")


def ngram(target_dir, draft_dir) -> Generate:
    """minispec's speculative_generate with prompt lookup (the draft directory is unused)."""
    return _speculative(target_dir, draft_dir, "ngram")


def early_exit(target_dir, draft_dir) -> Generate:
    """minispec's speculative_generate with the target's first layers drafting."""
    return _speculative(target_dir, draft_dir, "early-exit")


def autoregressive(target_dir, draft_dir) -> Generate:
    """minispec's autoregressive_generate: the reference pipeline, no drafts."""
    target = load(target_dir, device="cpu")

    def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        return autoregressive_generate(target, prompt_ids, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_k=top_k, top_p=top_p,
                                       seed=seed).tokens

    return generate


def _device_rounds(target_dir, draft_dir, device: str) -> Generate:
    from .core.sampling import Sampling
    from .core.speculative import Request
    from .device_rounds import DeviceRounds

    target = load(target_dir, device=device)
    rounds = DeviceRounds(target, load(draft_dir, device=device), gamma=GAMMA, max_len=64)

    def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
        return rounds.generate(prompt_ids, Sampling(temperature, top_k, top_p),
                               Request(max_new_tokens, seed=seed)).tokens

    return generate


def device_rounds(target_dir, draft_dir) -> Generate:
    """minispec.device_rounds with the draft model (gamma 3): every round on the device (here
    NumPy's: the CPU runs the same rounds)."""
    return _device_rounds(target_dir, draft_dir, "cpu")


def device_rounds_gpu(target_dir, draft_dir) -> Generate:
    """The same on the GPU, each round one CUDA graph."""
    return _device_rounds(target_dir, draft_dir, "gpu")
