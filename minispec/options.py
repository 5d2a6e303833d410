"""The command-line options every subcommand shares: one flag, one default, one parser each.

`python -m minispec` and its subcommands (bench, sweep, drafters, roofline, crossover, serve,
real) add these with the functions below, so `--gamma`, `--device`, `--dtype` and `--threads`
mean the same and default the same everywhere.
"""

from __future__ import annotations

import argparse

from .core.speculative import DEFAULT_GAMMA, gamma_policy
from .errors import MinispecError

DEVICES = ("auto", "cpu", "gpu")  # auto: the GPU when CuPy sees one, else the CPU
DTYPES = ("float32", "float16")


def parse_gamma(text, *, auto: bool = True) -> int | str:
    """A --gamma value: a positive integer, or 'auto' where `auto` (gamma_policy checks it)."""
    text = str(text).strip()
    if auto and text.lower() == "auto":
        return "auto"
    try:
        gamma = int(text)
    except ValueError:
        gamma = None
    try:
        gamma_policy(gamma)
    except MinispecError:
        what = "a positive integer or 'auto'" if auto else "a positive integer"
        raise MinispecError(f"gamma: expected {what}, got {text!r}") from None
    return gamma


def add_gamma(ap: argparse.ArgumentParser, *, auto: bool = True, what: str = "") -> None:
    """--gamma (a string until parse_gamma reads it, so that a bad value is one clear line)."""
    ap.add_argument("--gamma", default=str(DEFAULT_GAMMA),
                    help=(what or "draft tokens per round") + (", or 'auto'" if auto else ""))


def add_device(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", choices=DEVICES, default="auto",
                    help="where the models run (auto: the GPU when CuPy sees one)")


def add_dtype(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtype", choices=DTYPES, default=None,
                    help="compute dtype (default float32, a bfloat16 or float16 checkpoint's "
                    "matrices kept as stored on the CPU, and a GGUF conversion's Q4_1/Q8_0 "
                    "blocks read as stored; float32: widened at load, every matrix read in "
                    "float32; float16 is for the GPU, where a verify call's weight products "
                    "then run on the tensor cores)")


def add_activations(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--activations", choices=("float32", "int8"), default="float32",
                    help="int8: a GGUF conversion's Q4_1 and Q8_0 matrices multiply activations "
                    "quantized to int8 per block of 32 (llama.cpp's arithmetic: faster, another "
                    "model, not the float32 one's logits; the target only; needs AVX-512 VNNI "
                    "and the speed path)")


def check_activations(args: argparse.Namespace) -> None:
    """--activations int8 runs on the CPU speed path only (minispec.load says why)."""
    if args.activations == "int8" and getattr(args, "fast_steps", "on") == "off":
        raise MinispecError("--activations int8: needs --fast-steps on (that model's one "
                            "arithmetic is the CPU speed path's; on the plain path a verify call "
                            "and a step can round an activation differently)")


def add_fast_steps(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--fast-steps", choices=["on", "off"], default="on",
                    help="calls of a few tokens take the speed path: CUDA graphs on the GPU "
                    "(minispec/cuda_graphs.py), numba loops on the CPU (minispec/cpu_steps.py); "
                    "off: model.py's plain path")


def add_threads(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads for NumPy during the run (a decode step's small matmuls "
                    "are fastest on one thread on small or busy machines)")


MAX_REPEATS = 1000  # --repeats: timed passes or calls; more would run for days, not measure


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Each named option (attribute names: "repeats", "max_new_tokens") a positive integer where
    given, or MinispecError naming its flag: a count of 0 or less would run nothing and fail later
    with another error (a table of no timings); --repeats at most MAX_REPEATS."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise MinispecError(f"--{name.replace('_', '-')}: expected a positive integer, got "
                                f"{value!r}")
        if name == "repeats" and value is not None and value > MAX_REPEATS:
            raise MinispecError(f"--repeats: at most {MAX_REPEATS}, got {value}")


def check_num_prompts(args: argparse.Namespace) -> None:
    """--num-prompts an integer >= 0 (0: all), or MinispecError naming it."""
    if args.num_prompts < 0:
        raise MinispecError(f"--num-prompts: expected an integer >= 0 (0: all), got "
                            f"{args.num_prompts}")
