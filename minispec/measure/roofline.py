"""How close a decode step comes to the memory floor, on the CPU or an NVIDIA GPU.

A decode step must read every weight once: weight bytes / memory bandwidth is its floor. This
command measures the bandwidth (a read-only pass over a large array), the step time of a target
call of k tokens (k = 1 is a decode step, k = gamma + 1 a verify call), greedy generation, and the
same checkpoint in transformers, and prints the fraction of the floor each reaches. On the CPU
it also times the other roof, a token's arithmetic with the weights in the cache
(`harness.arithmetic_per_token`): a call of k tokens can take no less than k times it, and each
call is set against the larger of its two floors.

    minispec roofline                                    # the shipped target, CPU
    minispec roofline --device gpu --dtype float16       # the same on the GPU, CUDA graphs on/off
    minispec roofline --random-llama-1b /tmp/llama1b --device gpu --dtype float16
        # writes a 1.2B-parameter Llama-shaped checkpoint with random weights (transformers,
        # float16, 2.5 GB) to /tmp/llama1b first, then measures it

On the GPU two paths are timed: the plain one (model.py, every op a CuPy kernel launched from
Python) and `cuda_graphs` (fused kernels, each call of a few tokens replayed as one CUDA graph).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import MinispecError
from ..options import add_device, add_dtype, check_positive
from ..shipped import display, path_arg
from . import harness

LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}  # Llama 3.2 1B's
KS = (1, 2, 3, 5, 9, 16)


PROMPT_TOKENS = 8  # the prompt of the timed generations


def write_random_llama(out: Path, seed: int = 0) -> Path:
    """A Llama-shaped checkpoint of ~1.2B parameters with transformers' random initialisation,
    saved in float16 (on the GPU when torch sees one: initialising on the CPU takes a minute)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    where = next(p for p in (out, *out.parents) if p.exists())  # the folder it will be made in
    if not where.is_dir() or not os.access(where, os.W_OK):
        raise MinispecError(f"--random-llama-1b {out}: cannot write a checkpoint there "
                            f"({where} is {'not a folder' if not where.is_dir() else 'read-only'})")
    torch.manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_1B)).to(torch.float16)
    try:
        model.save_pretrained(out, safe_serialization=True)
    except OSError as e:
        raise MinispecError(f"--random-llama-1b {out}: cannot write the checkpoint ({e})") from None
    return out


def gpu_name(xp) -> str:
    if xp is np:
        return harness.machine_info()["cpu"]
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def generate_seconds(model, n: int, repeats: int = 3) -> tuple[float, list[int]]:
    """Best seconds of greedy generation of n tokens after an 8-token prompt, and the tokens."""
    from ..core.speculative import autoregressive_generate

    prompt = (np.arange(PROMPT_TOKENS) % min(model.vocab_size, 256) + 3).tolist()
    best, tokens = float("inf"), []
    for _ in range(repeats + 1):  # the first call warms up (and captures graphs)
        t0 = time.perf_counter()
        tokens = autoregressive_generate(model, prompt, max_new_tokens=n, temperature=0).tokens
        harness._sync(model)
        best = min(best, time.perf_counter() - t0)
    return best, tokens


def hf_generate_seconds(path, device: str, dtype: str, n: int, attn: str,
                        repeats: int = 3) -> tuple[float, list[int]]:
    """The same in transformers' generate (attention implementation `attn`), computing in
    `dtype` ("float32", "float16", ...)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                             attn_implementation=attn)
    m = m.to("cuda" if device == "gpu" else "cpu").eval()
    prompt = (torch.arange(PROMPT_TOKENS) % min(m.config.vocab_size, 256) + 3)[None].to(m.device)
    best, tokens = float("inf"), []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            out = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)
            if device == "gpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
            tokens = out[0, prompt.shape[1]:].tolist()
    del m
    return best, tokens


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens of a and b are equal."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def measure(path, *, device: str, dtype: str, ks=KS, context: int = 64, repeats: int = 20,
            new_tokens: int = 64, hf: bool = True, graphs: bool = True) -> dict:
    from .. import cuda_graphs
    from ..loader import load

    model = load(path, device=device, dtype=dtype)
    if PROMPT_TOKENS + new_tokens > model.config.max_position_embeddings:
        raise MinispecError(f"--new-tokens {new_tokens}: after the {PROMPT_TOKENS}-token prompt "
                            f"it passes the model's context length, "
                            f"{model.config.max_position_embeddings}")
    xp = model.xp
    nbytes = 2 * 2**30 if device == "gpu" else 256 * 2**20
    bw = harness.read_bandwidth(nbytes, 10, xp)
    floor = harness.memory_floor(model, bw)
    report = {"model": display(path), "device": model.device, "dtype": str(model.dtype),
              "hardware": gpu_name(xp), "read_bandwidth_GBps": bw / 1e9,
              "copy_bandwidth_GBps": harness.copy_bandwidth(nbytes, 10, xp) / 1e9,
              "weight_bytes": floor["weight_bytes"], "floor_step_s": floor["floor_step_s"],
              # the other roof, on the CPU: a token's arithmetic with the weights in the cache;
              # a call of k tokens takes at least max(floor, k x this)
              "arithmetic_per_token_s": harness.arithmetic_per_token(model, repeats=repeats),
              "paths": {}}
    paths = ["plain"] + (["graphs"] if graphs and model.device == "gpu" else [])
    for name in paths:
        if name == "graphs":
            t0 = time.perf_counter()
            cuda_graphs.enable(model)
        try:
            steps = harness.time_decode_steps([(model, k) for k in ks], context, repeats)
            gen_s, tokens = generate_seconds(model, new_tokens)
        except Exception as e:  # noqa: BLE001 - a path that fails is reported, the rest measured
            if name == "plain":
                raise
            report["paths_failed"] = {name: f"{type(e).__name__}: {e}"}
            cuda_graphs.disable(model)
            continue
        report["paths"][name] = {
            "step_s": dict(zip(map(str, ks), steps)),
            "t_over_t1": {str(k): s / steps[0] for k, s in zip(ks, steps)},
            "floor_fraction": floor["floor_step_s"] / steps[0],
            "generate_tokens_per_s": new_tokens / gen_s, "tokens": tokens}
        a = report["arithmetic_per_token_s"]
        if a is not None:  # each call against its floor: reading the weights or its arithmetic
            report["paths"][name]["call_floor_fraction"] = {
                str(k): max(floor["floor_step_s"], k * a) / s for k, s in zip(ks, steps)}
        if name == "graphs":
            report["paths"][name]["graph_captures"] = model.fast_steps.captures
            report["paths"][name]["seconds_with_captures"] = time.perf_counter() - t0
            cuda_graphs.disable(model)
    for name, err in report.get("paths_failed", {}).items():
        print(f"minispec roofline: the {name} path failed: {err}", file=sys.stderr)
    plain = report["paths"]["plain"]["tokens"]
    for name, p in report["paths"].items():
        p["same_tokens_as_plain"] = leading_agreement(p["tokens"], plain)
    del model
    if hf and importlib.util.find_spec("transformers") is not None:
        for attn in ("eager", "sdpa"):  # in minispec's compute dtype (float32 unless --dtype)
            s, tokens = hf_generate_seconds(path, device, report["dtype"], new_tokens, attn)
            report[f"hf_{attn}"] = {"generate_tokens_per_s": new_tokens / s,
                                    "same_tokens_as_plain": leading_agreement(tokens, plain)}
    return report


def format_report(r: dict) -> str:
    lines = [f"{r['model']} on {r['hardware']} ({r['device']}, {r['dtype']}): weights "
             f"{r['weight_bytes'] / 1e9:.3f} GB, read bandwidth {r['read_bandwidth_GBps']:.0f} "
             f"GB/s (copy {r['copy_bandwidth_GBps']:.0f}), floor "
             f"{r['floor_step_s'] * 1e3:.3f} ms per step"]
    if r.get("arithmetic_per_token_s"):
        a = r["arithmetic_per_token_s"]
        lines.append(f"  arithmetic alone {a * 1e3:.3f} ms a token (the products of 8 tokens, "
                     f"the weights in the cache): one step's reading pays for "
                     f"{r['floor_step_s'] / a:.1f} tokens' arithmetic")
    for name, p in r["paths"].items():
        steps = ", ".join(f"t({k}) {s * 1e3:.3f}" for k, s in p["step_s"].items())
        ratios = ", ".join(f"{k}: {v:.2f}" for k, v in p["t_over_t1"].items() if k != "1")
        lines.append(f"  {name:7s} {steps} ms; t(k)/t(1) {ratios}")
        lines.append(f"          decode step at {p['floor_fraction']:.0%} of the floor; greedy "
                     f"generate {p['generate_tokens_per_s']:.1f} tok/s; "
                     f"{p['same_tokens_as_plain']}/{len(p['tokens'])} tokens as plain")
        if r.get("arithmetic_per_token_s"):
            calls = ", ".join(f"t({k}) {v:.0%}" for k, v in p["call_floor_fraction"].items())
            lines.append(f"          each call against max(floor, k x arithmetic): {calls}")
    best = max(p["generate_tokens_per_s"] for p in r["paths"].values())
    for attn in ("eager", "sdpa"):
        if f"hf_{attn}" in r:
            h = r[f"hf_{attn}"]
            lines.append(f"  transformers generate ({attn}): {h['generate_tokens_per_s']:.1f} "
                         f"tok/s, {h['same_tokens_as_plain']} leading tokens as minispec; "
                         f"minispec's best {best / h['generate_tokens_per_s']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`minispec roofline [options]`."""
    ap = argparse.ArgumentParser(prog="minispec roofline", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", type=path_arg, default="shipped:target", help="checkpoint")
    ap.add_argument("--random-llama-1b", type=Path, default=None, metavar="DIR",
                    help="write a random 1.2B Llama-shaped checkpoint to DIR (needs torch and "
                    "transformers) and measure it instead of --target")
    add_device(ap)
    add_dtype(ap)
    ap.add_argument("--new-tokens", type=int, default=64, help="greedy tokens generated")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per k (median)")
    ap.add_argument("--hf", choices=["on", "off"], default="on",
                    help="transformers' generate beside (when installed)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        check_positive(args, "repeats", "new_tokens")
        path = args.target
        if args.random_llama_1b is not None:
            path = write_random_llama(args.random_llama_1b)
        from ..backend import get_backend

        device = get_backend(args.device)[1]
        report = measure(path, device=device, dtype=args.dtype, repeats=args.repeats,
                         new_tokens=args.new_tokens, hf=args.hf == "on")
    except MinispecError as e:
        print(f"minispec roofline: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0
