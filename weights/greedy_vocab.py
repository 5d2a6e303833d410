"""The tokens a target picks at temperature 0: weights/greedy_vocab.json, for drafting greedily.

A greedy draft needs only the argmax of its logits, and a target's argmax falls in a small part
of its vocabulary: over windows of its own training text, teacher-forced, the shipped toy
target's argmax took 330 distinct ids of 4,096. A drafter that computes only those rows of its
LM head at T = 0 (make_drafter("model", ...)'s `greedy_vocab`, minispec/drafters/vocab.py)
drafts the same tokens wherever the target's argmax is among them, and costs less per draft;
where it is not, that draft is rejected and the round ends there, still exactly the target's
greedy output (verify keeps only tokens the target's argmax agrees with).

This script counts the target's argmax over `--windows` windows of `--length` tokens taken at
random (seeded) from a text, and writes every id it saw and the EOS ids, ascending, into the
JSON file's entry for that target (keyed by the target's shape, as the shipped heads are; other
entries kept).

    python weights/greedy_vocab.py                     # the shipped toy target, its training text

The text defaults to the toy pair's training split of the Python standard library (train.py's
`read_corpus`: the held-out files, which the benchmark prompts come from, are not read);
`--text FILE` reads a UTF-8 file instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # minispec from this checkout

from minispec.drafters.files import target_signature  # noqa: E402
from minispec.loader import load  # noqa: E402


def training_text() -> list[str]:
    """The toy pair's training files (train.py's split: held-out files excluded)."""
    sys.path.insert(0, str(HERE))
    from train import read_corpus

    train, _, _ = read_corpus(False)
    return [text for _, text in train]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="shipped:target", help="a model directory")
    ap.add_argument("--text", default=None, help="a UTF-8 text file (default: the toy pair's "
                    "training files)")
    ap.add_argument("--windows", type=int, default=600)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "greedy_vocab.json"))
    args = ap.parse_args(argv)

    target = load(args.target)
    texts = ([Path(args.text).read_text(encoding="utf-8")] if args.text else training_text())
    ids = np.concatenate([np.array(e.ids, dtype=np.int64)
                          for e in target.tokenizer.tok.encode_batch(texts)])
    rng = np.random.default_rng(args.seed)
    starts = rng.choice(len(ids) - args.length, args.windows, replace=False)
    counts = np.zeros(target.vocab_size, dtype=np.int64)
    t0 = time.time()
    for s in starts:
        counts += np.bincount(target.logits(ids[s:s + args.length]).argmax(axis=1),
                              minlength=target.vocab_size)
    seen = np.flatnonzero(counts)
    print(f"{len(seen)} distinct argmax ids of {target.vocab_size} over {counts.sum()} positions "
          f"({time.time() - t0:.0f} s)")

    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {
        "about": "per target: the token ids its argmax took over windows of text (weights/"
                 "greedy_vocab.py); a drafter computes only their rows at temperature 0",
        "vocabularies": []}
    sig = target_signature(target.config)
    entry = {"target": sig, "source": args.text or "the toy pair's training files (train.py)",
             "windows": args.windows, "length": args.length, "seed": args.seed,
             "positions": int(counts.sum()),
             "ids": sorted(set(seen.tolist()) | set(target.config.eos_token_ids))}  # + EOS
    doc["vocabularies"] = [v for v in doc["vocabularies"] if v["target"] != sig] + [entry]
    out.write_text(json.dumps(doc) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
