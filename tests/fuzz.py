"""A seeded fuzz campaign against minispec's boundaries: mutated checkpoint directories
(safetensors header and data, config.json with its numbers too big, too small or missing,
tokenizer.json, the BOS/EOS ids of generation_config.json and tokenizer_config.json, files that
are not regular files), bad load(dtype=...) values, bad generation parameters and bad verify()
arguments.

Each case runs in its own forked process under a 4 GiB address-space cap and a 20 s timeout, and
is classified:

    error        MinispecError, the one exception bad input may raise
    accepted     no error (a mutation the format allows, or a harmless one)
    other        any other exception (a bug: the message should have named the input)
    hang         killed at the timeout
    memory       MemoryError or killed by the memory cap
    crash        the process died of a signal
    silent       accepted, but the result breaks a rule a user relies on (a token outside the
                 vocabulary, a non-flat verify output, non-finite logits)

    python tests/fuzz.py --cases 10000 --seed 1 --jobs 2      # the campaign, with its table
    python tests/fuzz.py --seed 1 --repro config:123          # one case, in this process

tests/test_fuzz.py runs a few hundred cases as part of the suite.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import minispec  # noqa: E402  (the checkout's, imported once before forking)
from minispec.errors import MinispecError  # noqa: E402

BASE = ROOT / "weights" / "draft"  # a real, small checkpoint directory (2.4 MB)
KINDS = ("safetensors", "config", "tokenizer", "special", "tokens", "dtype", "generate", "verify")
MEMORY_CAP = 4 * 2**30  # what a case may map beyond the address space it inherits (child)
TIMEOUT = 20.0
EXIT = {0: "accepted", 10: "error", 11: "other", 12: "memory", 13: "silent"}

WEIRD = [None, True, False, 0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**12, 10**400, 1e-320, 5e-324,
         1e308, -0.5, 0.5, 1.5, "", "x", "1", [], [1], [[1]], {}, {"a": 1}, float("nan"),
         float("inf")]
# the fields whose numbers feed float math (RMSNorm's epsilon, the RoPE frequencies): an integer
# no float holds (10**400) must be refused naming the field, not end in an OverflowError
HUGE = [10**400, 10**309, -(10**400)]  # 10**309: just past the largest float (1.8e308)
NUMBERS = [10**300, 1e308, 1e-320, 5e-324, 0, 0.0, -1, 1, 1.0000001, 2, 4096, True, "8", None]
ROPE = {"llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5, "attention_factor": None},
        "linear": {"factor": 2.0}}
RAW_WEIRD = ["1" * 5000, "1e400", "-1e400", "NaN", "Infinity", "[" * 100000 + "]" * 100000,
             '"\\ud800"', "null", "[]", "{}"]


# ---- mutations ---------------------------------------------------------------------------------


def mutate_json_value(doc, rng: random.Random, depth: int = 0):
    """A copy of doc with one value somewhere replaced, deleted or added."""
    if isinstance(doc, dict) and doc and (depth == 0 or rng.random() < 0.7):
        key = rng.choice(list(doc))
        if rng.random() < 0.5 and isinstance(doc[key], (dict, list)) and doc[key]:
            doc[key] = mutate_json_value(doc[key], rng, depth + 1)
        elif rng.random() < 0.15:
            del doc[key]
        else:
            doc[key] = rng.choice(WEIRD)
    elif isinstance(doc, list) and doc:
        i = rng.randrange(len(doc))
        doc[i] = mutate_json_value(doc[i], rng, depth + 1) if rng.random() < 0.5 \
            else rng.choice(WEIRD)
    else:
        return rng.choice(WEIRD)
    return doc


def dump(doc, rng: random.Random) -> str:
    """JSON text, sometimes with one value spliced in raw (huge numbers, NaN, deep nesting)."""
    text = json.dumps(doc, allow_nan=True)
    if rng.random() < 0.3:
        raw = rng.choice(RAW_WEIRD)
        spots = [i for i, c in enumerate(text) if c == ":"]
        if spots:
            i = rng.choice(spots) + 1
            end = i
            depth = 0
            while end < len(text):  # the value after the colon: up to the next , or } at depth 0
                c = text[end]
                if c in "[{":
                    depth += 1
                elif c in "]}":
                    if depth == 0:
                        break
                    depth -= 1
                elif c == "," and depth == 0:
                    break
                end += 1
            text = text[:i] + " " + raw + text[end:]
    return text


def mutate_safetensors(d: Path, rng: random.Random) -> None:
    path = d / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    how = rng.choice(["field", "field", "length", "truncate", "flip-data", "flip-header",
                      "raw", "shift", "many"])
    if how == "field":
        name = rng.choice(list(header))
        if name == "__metadata__" or rng.random() < 0.2:
            header = mutate_json_value(header, rng)
        else:
            entry = header[name]
            field = rng.choice(["dtype", "shape", "data_offsets"])
            entry[field] = rng.choice(WEIRD + [[10**9, 10**9], [1] * 30000, ["F32"], "F99",
                                               [0, 10**15], [5, 2], [2**40]])
        text = dump(header, rng).encode()
        raw = struct.pack("<Q", len(text)) + text + data
    elif how == "length":
        delta = rng.choice([-9, -1, 1, 7, 2**32, -n, 2**62])
        raw[:8] = struct.pack("<Q", max(0, min(2**64 - 1, n + delta)))
    elif how == "truncate":
        raw = raw[: rng.randrange(len(raw))]
    elif how == "flip-data":
        for _ in range(rng.randint(1, 8)):
            i = 8 + n + rng.randrange(len(data))
            raw[i] ^= 1 << rng.randrange(8)
    elif how == "flip-header":
        i = 8 + rng.randrange(n)
        raw[i] = rng.randrange(256)
    elif how == "raw":
        text = dump(header, random.Random(rng.random())).encode()
        text = rng.choice(RAW_WEIRD).encode() if rng.random() < 0.5 else text
        raw = struct.pack("<Q", len(text)) + text + data
    elif how == "many":  # tens of thousands of empty tensors: the count is bounded, not parsed
        from minispec.safetensors import MAX_TENSORS

        empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
        extra = rng.choice([MAX_TENSORS - len(header), MAX_TENSORS + 1, 2 * MAX_TENSORS])
        header.update({f"empty.{i}": empty for i in range(extra)})
        text = json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + data
    else:  # the header one byte short: every tensor shifted by a byte
        raw = struct.pack("<Q", n - 1) + raw[8:]
    path.write_bytes(bytes(raw))


def mutate_config(d: Path, rng: random.Random) -> None:
    path = d / "config.json"
    doc = json.loads(path.read_text())
    how = rng.random()
    if how < 0.15:
        doc[rng.choice(["num_hidden_layers", "hidden_size", "max_position_embeddings",
                        "vocab_size", "intermediate_size"])] = rng.choice(
            [10**7, 10**12, 0, -3, 10**6])
    elif how < 0.45:
        doc = mutate_numbers(doc, rng)
    else:
        doc = mutate_json_value(doc, rng)
    path.write_text(dump(doc, rng))


def mutate_numbers(doc: dict, rng: random.Random) -> dict:
    """rms_norm_eps, rope_theta (top level or in rope_parameters) or a rope scaling parameter
    (linear, llama3, YaRN) set to a number too big, too small, zero or of the wrong type."""
    number = rng.choice(HUGE if rng.random() < 0.5 else NUMBERS)
    if rng.random() < 0.6:  # a scaled rope_type, spelled either way
        kind = rng.choice(list(ROPE))
        scaling = {"rope_type": kind, **ROPE[kind]}
        scaling[rng.choice(list(ROPE[kind]))] = number
        if rng.random() < 0.5:
            doc.pop("rope_parameters", None)
            doc["rope_scaling"] = scaling
        else:
            doc["rope_parameters"] = {"rope_theta": doc.get("rope_theta", 10000.0), **scaling}
    else:
        key = rng.choice(["rms_norm_eps", "rope_theta", "rope_parameters"])
        if key == "rope_parameters":
            doc[key] = {"rope_type": "default", "rope_theta": number}
        else:
            doc[key] = number
    return doc


TOKEN_IDS = [0, 1, 4095, 4096, 4097, 10**12, 10**400, -1, [0, 4096], [4095, 0], [], "0", 1.0,
             True, None]


def mutate_tokens(d: Path, rng: random.Random) -> None:
    """The BOS/EOS ids minispec reads at load: generation_config.json's ids (the vocabulary has
    4096 rows), tokenizer_config.json's token strings, or config.json's ids."""
    name = rng.choice(["generation_config.json", "tokenizer_config.json", "config.json"])
    path = d / name
    doc = json.loads(path.read_text())
    for key in rng.sample(["bos", "eos"], rng.randint(1, 2)):
        if name == "tokenizer_config.json":
            doc[f"{key}_token"] = rng.choice(["<|endoftext|>", "</s>", "a", "", None, 5,
                                              {"content": "<|endoftext|>"}, {"content": 7}])
        else:
            doc[f"{key}_token_id"] = rng.choice(TOKEN_IDS)
    path.write_text(json.dumps(doc))


def mutate_tokenizer(d: Path, rng: random.Random) -> None:
    path = d / "tokenizer.json"
    doc = json.loads(path.read_text())
    how = rng.random()
    if how < 0.15:
        doc["padding"] = {"strategy": {"Fixed": rng.choice([10**9, 10**6, -1])},
                          "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                          "pad_type_id": 0, "pad_token": "[PAD]"}
    elif how < 0.25:
        doc["truncation"] = {"max_length": rng.choice([1, 0, 10**9]), "stride": 10**6,
                             "strategy": "LongestFirst", "direction": "Right"}
    elif how < 0.4:
        doc["normalizer"] = rng.choice([{"type": "Precompiled", "precompiled_charsmap": "AAAA"},
                                        {"type": "Replace", "pattern": {"String": ""},
                                         "content": "x"}, {"type": "Nope"}, 5])
    elif how < 0.5:
        doc["post_processor"] = {"type": "TemplateProcessing",
                                 "single": [{"SpecialToken": {"id": "<missing>", "type_id": 0}}],
                                 "pair": [], "special_tokens": {}}
    else:
        doc = mutate_json_value(doc, rng)
    path.write_text(dump(doc, rng))


def mutate_special(d: Path, rng: random.Random) -> None:
    name = rng.choice(["model.safetensors", "config.json", "tokenizer.json"])
    os.remove(d / name)
    if rng.random() < 0.7:
        os.mkfifo(d / name)
    else:
        os.mkdir(d / name)


# ---- cases ------------------------------------------------------------------------------------


def check_model(model) -> None:
    """A loaded model must decode: finite logits, token ids in range (else: silent)."""
    ids = [1, 2, 3] if model.tokenizer is None else model.tokenizer.encode("def f(x):")
    c = model.config
    special = [*c.eos_token_ids, c.bos_token_id, c.eos_token_id]
    if model.tokenizer is not None:
        special += [model.tokenizer.bos_id, model.tokenizer.eos_id]
    if not all(i is None or 0 <= i < model.vocab_size for i in special):
        raise SilentError(f"a BOS/EOS id outside the vocabulary was accepted: {special}")
    out = minispec.autoregressive_generate(model, ids, max_new_tokens=3, temperature=0.0)
    if not all(0 <= t < model.vocab_size for t in out.tokens):
        raise SilentError(f"tokens outside the vocabulary: {out.tokens}")
    logits = model.logits(ids)
    if not np.isfinite(logits).all():
        raise SilentError("non-finite logits from a model that loaded")


class SilentError(Exception):
    pass


MODEL = None


def shared_model():
    global MODEL
    if MODEL is None:
        MODEL = minispec.load(BASE, device="cpu")
    return MODEL


def case_generate(rng: random.Random) -> None:
    target = shared_model()
    kw = {"gamma": 2, "max_new_tokens": 4, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
          "eos_token_id": None, "seed": 0}
    prompt = [1, 2, 3]
    for _ in range(rng.randint(1, 2)):
        key = rng.choice(list(kw) + ["prompt"])
        value = rng.choice(WEIRD + [np.array([4, 5]), np.array(5), iter([3]), "auto",
                                    [[1], [1, 2]], [10**9], [-1], (1, 2), 10**400, 5e-324])
        if key == "prompt":
            prompt = value
        else:
            kw[key] = value
    out = minispec.speculative_generate(target, target, prompt, **kw)
    if not all(isinstance(t, int) and 0 <= t < target.vocab_size for t in out.tokens):
        raise SilentError(f"tokens outside the vocabulary: {out.tokens!r:.100}")


DTYPES = [None, "float32", "float16", np.float32, "bfloat16", "float64", "int8", ">f4", "V8",
          "S3", "U", object, "no such dtype", 3.5, 10**400, [("a", "f4", (-1,))], [("a", "f4")],
          {"names": ["a"], "formats": ["f4"], "offsets": [-4]}, np.dtype([("a", "<f2", (2,))]),
          ("f4", (2,)), [], {}, "f4, f2"]


def case_dtype(rng: random.Random) -> None:
    model = minispec.load(BASE, dtype=rng.choice(DTYPES), device="cpu")
    if model.dtype not in (np.float32, np.float16):
        raise SilentError(f"loaded with compute dtype {model.dtype}")


def case_verify(rng: random.Random) -> None:
    V, g = rng.choice([0, 1, 3, 5]), rng.choice([0, 1, 2, 3])
    r = np.random.default_rng(rng.randrange(1000))
    p = r.dirichlet(np.ones(max(V, 1)), g + 1)[:, :V] if V else np.zeros((g + 1, 0))
    q = r.dirichlet(np.ones(max(V, 1)), g)[:, :V] if V else np.zeros((g, 0))
    d = r.integers(0, max(V, 1), g)
    args = [p, q, d, r]
    for _ in range(rng.randint(1, 2)):
        i = rng.randrange(4)
        bad = rng.choice([None, "x", 3, [], p.tolist(), np.full_like(p, np.nan), -p, p * 2,
                          np.zeros_like(p), d - 5, d + V, d.astype(float), q[:, :1], p[:1],
                          np.array([[1]]), q.tolist(), random.Random(0)])
        args[i] = bad if i != 0 or rng.random() < 0.8 else np.nan
    out = minispec.verify(*args)
    out = np.asarray(out)
    if out.ndim != 1 or not len(out) or out.min() < 0 or out.max() >= np.shape(args[0])[1]:
        raise SilentError(f"verify returned {out!r:.100}")


def run_case(kind: str, index: int, seed: int, workdir: Path) -> None:
    """One case, in the current process: raises what minispec raises (or SilentError)."""
    rng = random.Random(f"{seed}:{kind}:{index}")
    if kind == "generate":
        return case_generate(rng)
    if kind == "verify":
        return case_verify(rng)
    if kind == "dtype":
        return case_dtype(rng)
    d = workdir / f"{kind}-{index}"
    shutil.copytree(BASE, d)
    {"safetensors": mutate_safetensors, "config": mutate_config, "tokenizer": mutate_tokenizer,
     "special": mutate_special, "tokens": mutate_tokens}[kind](d, rng)
    check_model(minispec.load(d, device="cpu"))


def child(kind: str, index: int, seed: int, workdir: Path) -> int:
    # the cap is on the case's own allocations: a fork inherits its parent's address space,
    # which in a pytest worker that ran torch, numba and SmolLM2 before can be most of the cap
    cap = memory_bytes(0) + MEMORY_CAP
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        run_case(kind, index, seed, workdir)
        return 0
    except MinispecError as e:
        if len(str(e)) > 2000:
            print(f"overlong message ({len(str(e))} characters)", file=sys.stderr)
            return 11
        return 10
    except MemoryError:
        return 12
    except SilentError as e:
        print(f"silent: {e}", file=sys.stderr)
        return 13
    except BaseException:  # noqa: BLE001 - everything else is what the campaign looks for
        traceback.print_exc(limit=3)
        return 11


def memory_bytes(field: int) -> int:
    """This process's memory from /proc/self/statm (0 where it is missing): field 0 its address
    space, 1 its resident pages."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[field])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> float:
    """This process's resident memory in MB (0 where /proc is missing). A forked case starts with
    its parent's pages resident, so a case's own peak is its maxrss less this at the fork."""
    return memory_bytes(1) / 2**20


def campaign(cases: int, seed: int, jobs: int, quiet: bool = False) -> dict:
    shared_model()  # loaded once, before forking
    workdir = Path(tempfile.mkdtemp(prefix="minispec-fuzz-"))
    todo = [(KINDS[i % len(KINDS)], i) for i in range(cases)]
    running: dict[int, tuple] = {}
    counts: collections.Counter = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    peak = []
    t0 = time.time()
    try:
        while todo or running:
            while todo and len(running) < jobs:
                kind, index = todo.pop(0)
                err = workdir / f"err-{index}"
                pid = os.fork()
                if pid == 0:  # the child
                    fd = os.open(err, os.O_WRONLY | os.O_CREAT)
                    os.dup2(fd, 2)
                    os._exit(child(kind, index, seed, workdir))
                running[pid] = (kind, index, time.time(), err, resident_mb())
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                for p, (kind, index, start, err, _) in list(running.items()):
                    if time.time() - start > TIMEOUT:
                        os.kill(p, signal.SIGKILL)
                        os.waitpid(p, 0)
                        del running[p]
                        counts["hang"] += 1
                        examples["hang"].append(f"{kind}:{index}")
                time.sleep(0.002)
                continue
            kind, index, start, err, base = running.pop(pid)
            peak.append(max(0.0, usage.ru_maxrss / 1024 - base))  # MB, beyond what it inherited
            if os.WIFSIGNALED(status):
                outcome = "memory" if os.WTERMSIG(status) == signal.SIGKILL else "crash"
            else:
                outcome = EXIT.get(os.WEXITSTATUS(status), "crash")
            counts[outcome] += 1
            if outcome not in ("error", "accepted"):
                text = err.read_text(errors="replace").strip().splitlines()
                examples[outcome].append(f"{kind}:{index}  {text[-1] if text else ''}"[:300])
            err.unlink(missing_ok=True)
            shutil.rmtree(workdir / f"{kind}-{index}", ignore_errors=True)
            done = sum(counts.values())
            if not quiet and sys.stderr.isatty() and done % 200 == 0:
                print(f"  {done}/{cases} cases, {time.time() - t0:.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"cases": cases, "seed": seed, "seconds": time.time() - t0, "counts": dict(counts),
            "examples": {k: v[:10] for k, v in examples.items()},
            "peak_rss_mb": {"median": float(np.median(peak)) if peak else 0.0,
                            "max": float(max(peak)) if peak else 0.0}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--repro", metavar="KIND:INDEX", help="run one case here, with its traceback")
    args = ap.parse_args(argv)
    if args.repro:
        kind, _, index = args.repro.partition(":")
        with tempfile.TemporaryDirectory() as d:
            run_case(kind, int(index), args.seed, Path(d))
        print("accepted")
        return 0
    report = campaign(args.cases, args.seed, args.jobs)
    c = report["counts"]
    print(f"fuzz campaign: {report['cases']} cases, seed {report['seed']}, "
          f"{report['seconds']:.0f} s")
    for outcome in ("error", "accepted", "other", "hang", "memory", "crash", "silent"):
        print(f"  {outcome:<9} {c.get(outcome, 0):>6}")
    rss = report["peak_rss_mb"]
    print(f"  peak RSS per case (beyond the pages it inherited): median {rss['median']:.0f} MB, "
          f"max {rss['max']:.0f} MB")
    for outcome, items in report["examples"].items():
        print(f"{outcome}:")
        for item in items:
            print(f"  {item}")
    bad = sum(c.get(k, 0) for k in ("other", "hang", "memory", "crash", "silent"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
