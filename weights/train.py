"""Train minispec's shipped draft/target pair on the Python standard library (issue 4).

The recipe, end to end, on a CPU:

1. corpus: the ``.py`` files of the running interpreter's standard library (``sysconfig``'s
   ``stdlib`` path), without site-packages, the test suites, idlelib, lib2to3, pydoc_data,
   ensurepip and files over 256 KB. Whole files are held out for evaluation: those whose path's
   MD5 falls in bucket 0 of 20 (about 5% of the files).
2. a byte-level BPE tokenizer (``tokenizers``, vocabulary 4096, one special token
   ``<|endoftext|>`` that is both BOS and EOS) trained on the training files.
3. the target, a Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention) trained with
   cross-entropy on random 512-token windows of the training stream (BF16 autocast).
4. the draft, a much smaller Llama, distilled from the target: forward KL(p_target || q_draft) on
   the same kind of windows, target logits computed on the fly. Acceptance is what a draft is
   for, and with temperature-1 sampling the acceptance rate is 1 - TV(p, q), which KL bounds.
5. on-policy distillation (DistillSpec): the target generates continuations (half greedy, half
   temperature 1) of prefixes cut from the training files, and the draft is fine-tuned on them
   with KL(p_target || q_draft) plus a little cross-entropy on the greedy continuations, since at
   decode time the draft predicts the target's own output, not corpus text.
6. both saved as Hugging Face directories (config.json, model.safetensors, tokenizer.json,
   tokenizer_config.json, generation_config.json): target in BF16, draft in F16; plus
   ``prompts.json``, short prompts cut from the held-out files, for the benchmarks.

Usage (from the repository root)::

    python weights/train.py --out weights            # the shipped pair
    python weights/train.py --out /tmp/ws --quick    # a smoke run of a minute
    python weights/train.py --out OUT --draft-only --draft-steps 0  # on-policy stage only

Needs ``torch`` and ``transformers`` (``pip install -e .[train]``). Seeded; the BPE trainer and
the data order are deterministic, but BF16 matmuls on other CPUs may round differently.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sysconfig
import time
from pathlib import Path

import numpy as np

EOT = "<|endoftext|>"  # id 0: separates files, and is the BOS every prompt starts with
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "idlelib", "lib2to3",
                 "pydoc_data", "ensurepip", "__pycache__"}
MAX_FILE_BYTES = 256 * 1024  # leaves out a few generated tables that would dominate the corpus
HOLDOUT_BUCKETS = 20         # a file is held out when md5(relative path) % 20 == 0

TARGET = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 5,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}
DRAFT = {"hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 1,
         "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 64}
QUICK_TARGET = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
QUICK_DRAFT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}


def corpus_files(root: Path) -> list[Path]:
    """The stdlib .py files of the corpus, sorted by relative path (deterministic)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".py") and path.stat().st_size <= MAX_FILE_BYTES:
                out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(rel: str) -> bool:
    """Whether a file (by its path relative to the stdlib root) is held out for evaluation."""
    return int(hashlib.md5(rel.encode()).hexdigest(), 16) % HOLDOUT_BUCKETS == 0


def read_corpus(quick: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]], Path]:
    """(train, heldout) lists of (relative path, text), and the stdlib root they came from."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, heldout = [], []
    for path in corpus_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        (heldout if is_heldout(rel) else train).append((rel, text))
    if quick:
        train, heldout = train[:60], heldout[:12]
    return train, heldout, root


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenizer) with EOT as token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOT) == 0
    return tok


def token_stream(tok, texts: list[str]) -> np.ndarray:
    """All files as one int32 stream, each file preceded by EOT (= BOS)."""
    parts = []
    for enc in tok.encode_batch(texts):
        parts.append(np.array([0] + enc.ids, dtype=np.int32))
    return np.concatenate(parts)


def llama_config(shape: dict, vocab_size: int, context: int):
    """A transformers LlamaConfig of the given shape; BOS = EOS = EOT (id 0); tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=context,
                       rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                           "rope_theta": 10000.0},
                       tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                       attention_bias=False, mlp_bias=False, **shape)


def adamw(model, lr: float):
    """AdamW (betas 0.9/0.95), weight decay 0.1 on matrices only: the optimizer of every stage."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def batches(stream: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    """Endless random windows of seq+1 tokens from the stream, as an int64 tensor [B, seq+1]."""
    import torch

    while True:
        starts = rng.integers(0, len(stream) - seq - 1, size=batch)
        yield torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))


def eval_windows(stream: np.ndarray, seq: int, n: int):
    """Up to n consecutive non-overlapping held-out windows [n, seq+1] (fixed, comparable)."""
    import torch

    n = min(n, (len(stream) - 1) // seq)
    return torch.from_numpy(np.stack([stream[i * seq:i * seq + seq + 1]
                                      for i in range(n)]).astype(np.int64))


def heldout_metrics(model, windows, teacher=None, batch: int = 8) -> dict[str, float]:
    """Mean held-out cross-entropy (nats/token), and KL(teacher || model) given a teacher."""
    import torch
    import torch.nn.functional as F

    model.eval()
    ce_sum, kl_sum, n = 0.0, 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch]
            logq = F.log_softmax(model(input_ids=w[:, :-1]).logits.float(), -1)
            ce_sum += F.nll_loss(logq.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
            if teacher is not None:
                logp = F.log_softmax(teacher(input_ids=w[:, :-1]).logits.float(), -1)
                kl_sum += (logp.exp() * (logp - logq)).sum().item()
            n += w[:, 1:].numel()
    model.train()
    out = {"ce": ce_sum / n, "ppl": math.exp(ce_sum / n), "tokens": n}
    if teacher is not None:
        out["kl_to_target"] = kl_sum / n
    return out


def train(model, stream, *, steps, batch, seq, lr, seed, teacher=None, log_every=25) -> float:
    """Train `model` (CE, or forward KL to `teacher`); returns seconds taken."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    opt = adamw(model, lr)
    warmup = max(1, steps // 20)
    data = batches(stream, batch, seq, rng)
    t0 = time.time()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        w = next(data)
        x, y = w[:, :-1], w[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits.float()
            if teacher is None:
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            else:
                with torch.no_grad():
                    logp = F.log_softmax(teacher(input_ids=x).logits.float(), -1)
                logq = F.log_softmax(logits, -1)
                loss = (logp.exp() * (logp - logq)).sum(-1).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            dt = time.time() - t0
            print(f"  step {step:5d}/{steps}  loss {loss.item():.4f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {dt:7.1f}s  "
                  f"{(step + 1) * batch * seq / dt:6.0f} tok/s", flush=True)
    return time.time() - t0


def def_class_lines(lines: list[str]) -> list[int]:
    """Indexes of the lines that open a function or class: where prompts and prefixes start."""
    return [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))]


def onpolicy_prefixes(tok, files: list[tuple[str, str]], lo: int, hi: int,
                      rng: np.random.Generator) -> dict[int, list[list[int]]]:
    """Prefixes for on-policy distillation, from TRAINING files only: whole lines from a
    `def`/`class` line (the shape of the held-out prompts), lo..hi tokens without BOS, as
    [EOT] + ids, grouped by length (so a batch needs no padding)."""
    by_len: dict[int, list[list[int]]] = {}
    for _, text in files:
        lines = text.splitlines(keepends=True)
        starts = def_class_lines(lines)
        for i in starts:
            n_lines = int(rng.integers(1, 12))  # a few lines: 32..128 tokens usually
            ids = tok.encode("".join(lines[i:i + n_lines])).ids
            while len(ids) > hi and n_lines > 1:
                n_lines -= 1
                ids = tok.encode("".join(lines[i:i + n_lines])).ids
            if lo <= len(ids) <= hi:
                by_len.setdefault(len(ids), []).append([0] + ids)
    return by_len


def onpolicy_sequences(target, tok, files, *, n: int, batch: int, new_tokens: tuple[int, int],
                       prefix: tuple[int, int], seed: int) -> list:
    """`n` sequences [prefix + target continuation] made by the target itself (KV cache,
    batched; half greedy, half sampled at temperature 1 with no top-k/top-p), as a list of
    (int64 tensor [B, L + G], L, sampled) triples: B sequences of one prefix length L each."""
    import torch
    from transformers import GenerationConfig

    rng = np.random.default_rng(seed)
    by_len = onpolicy_prefixes(tok, files, prefix[0], prefix[1], rng)
    lengths = sorted(k for k, v in by_len.items() if len(v) >= batch)
    out, made = [], 0
    torch.manual_seed(seed)
    while made < n:
        L = int(rng.choice(lengths))
        pool = by_len[L]
        pick = rng.choice(len(pool), size=batch, replace=False)
        x = torch.tensor([pool[j] for j in pick], dtype=torch.int64)
        g = int(rng.integers(new_tokens[0], new_tokens[1] + 1))
        sample = (len(out) % 2 == 1)  # alternate greedy / temperature-1 batches
        cfg = GenerationConfig(max_new_tokens=g, min_new_tokens=0, do_sample=sample,
                               temperature=1.0 if sample else None, top_k=None if not sample else 0,
                               top_p=1.0 if sample else None, eos_token_id=None, pad_token_id=0,
                               bos_token_id=0, use_cache=True)
        with torch.no_grad():
            seq = target.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                  generation_config=cfg)
        out.append((seq, x.shape[1], sample))
        made += batch
    return out


def train_onpolicy(draft, target, seqs, *, steps, lr, seed, ce=0.0, log_every=25) -> float:
    """Fine-tune the draft with forward KL(target || draft) on the target's own generations
    (every position of each sequence: the prefix keeps it close to the corpus, the continuation
    is what it sees at decode time), plus `ce` x cross-entropy of the greedy continuations'
    tokens (the target's argmax: what greedy acceptance needs the draft's argmax to be);
    returns seconds taken."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    opt = adamw(draft, lr)
    warmup = max(1, steps // 20)
    t0, ntok = time.time(), 0
    draft.train()
    order = []
    for step in range(steps):
        if not order:
            order = list(rng.permutation(len(seqs)))
        seq, L, sampled = seqs[order.pop()]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x = seq[:, :-1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                logp = F.log_softmax(target(input_ids=x).logits.float(), -1)
            logq = F.log_softmax(draft(input_ids=x).logits.float(), -1)
            kl = (logp.exp() * (logp - logq)).sum(-1)  # [B, T]
            loss = kl.mean()
            if ce > 0 and not sampled:
                loss = loss + ce * F.nll_loss(logq[:, L - 1:].flatten(0, 1),
                                              seq[:, L:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ntok += x.numel()
        if step % log_every == 0 or step == steps - 1:
            dt = time.time() - t0
            print(f"  step {step:5d}/{steps}  loss {loss.item():.4f}  kl {kl.mean().item():.4f}  "
                  f"kl(generated) {kl[:, L - 1:].mean().item():.4f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {dt:7.1f}s  {ntok / dt:6.0f} tok/s",
                  flush=True)
    return time.time() - t0


def with_bos_post_processor(tok_json: str) -> str:
    """tokenizer.json that puts EOT (the BOS) in front of every text, as the model was trained:
    transformers' AutoTokenizer and minispec's Tokenizer then both add it."""
    doc = json.loads(tok_json)
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": EOT, "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": EOT, "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": EOT, "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {EOT: {"id": EOT, "ids": [0], "tokens": [EOT]}}}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def save_pair_member(model, tok_json: str, out: Path, dtype, context: int) -> None:
    """Write one HF directory: config, safetensors weights, tokenizer files, generation config."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT,
        "unk_token": None, "add_bos_token": True, "model_max_length": context,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}, indent=2) + "\n")


def make_prompts(tok, heldout: list[tuple[str, str]], per_file: int, n_max: int) -> list[dict]:
    """Short prompts cut from held-out files: from a `def`/`class` line, whole lines, 32..128
    tokens (BOS not counted). At most `per_file` from each file, spread over the file."""
    prompts = []
    for rel, text in heldout:
        lines = text.splitlines(keepends=True)
        starts = def_class_lines(lines)
        if not starts:
            continue
        picks = sorted({starts[int(j * len(starts) / per_file)] for j in range(per_file)})
        for i in picks:
            text_ = ""
            for line in lines[i:]:
                if len(tok.encode(text_ + line).ids) > 128:
                    break
                text_ += line
                if len(tok.encode(text_).ids) >= 64:
                    break
            n = len(tok.encode(text_).ids)
            if 32 <= n <= 128:
                prompts.append({"id": len(prompts), "file": rel, "line": i + 1, "text": text_,
                                "n_tokens": n})
    return prompts[:n_max]


def main(argv: list[str] | None = None) -> None:
    """Run the whole recipe; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="weights", help="directory for target/, draft/, prompts.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=512, help="training window (= context length)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=350, help="target training steps")
    p.add_argument("--draft-steps", type=int, default=700)
    p.add_argument("--lr", type=float, default=2e-3, help="target peak learning rate")
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny models, few steps: a smoke run")
    p.add_argument("--draft-layers", type=int, default=1, help="the draft's number of layers")
    p.add_argument("--draft-only", action="store_true",
                   help="keep OUT/target (made by the same command) and train only the draft; "
                        "with --draft-steps 0, keep OUT/draft too and run only the on-policy stage")
    p.add_argument("--onpolicy-steps", type=int, default=500,
                   help="on-policy distillation steps after the corpus distillation (0 = none)")
    p.add_argument("--onpolicy-seqs", type=int, default=1024,
                   help="sequences the target generates for the on-policy stage")
    p.add_argument("--onpolicy-batch", type=int, default=16)
    p.add_argument("--onpolicy-lr", type=float, default=1e-3)
    p.add_argument("--onpolicy-ce", type=float, default=0.5,
                   help="weight of the cross-entropy on the target's greedy continuations")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.draft_steps, args.seq, args.vocab = 20, 20, 128, 512
        args.onpolicy_steps, args.onpolicy_seqs = min(args.onpolicy_steps, 10), 32

    # on a shared CPU, spinning OpenMP workers wait for descheduled peers: let them sleep
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    t_start = time.time()
    report: dict = {"argv": argv if argv is not None else __import__("sys").argv[1:],
                    "torch": torch.__version__, "seed": args.seed}

    train_files, heldout_files, root = read_corpus(args.quick)
    report["corpus"] = {"stdlib": str(root), "train_files": len(train_files),
                        "heldout_files": len(heldout_files),
                        "train_bytes": sum(len(t.encode()) for _, t in train_files),
                        "heldout_bytes": sum(len(t.encode()) for _, t in heldout_files)}
    print(f"corpus: {report['corpus']}", flush=True)

    t = time.time()
    tok = train_tokenizer([text for _, text in train_files], args.vocab)
    train_ids = token_stream(tok, [text for _, text in train_files])
    heldout_ids = token_stream(tok, [text for _, text in heldout_files])
    report["tokenizer"] = {"vocab": tok.get_vocab_size(), "train_tokens": len(train_ids),
                           "heldout_tokens": len(heldout_ids),
                           "bytes_per_token": report["corpus"]["train_bytes"] / len(train_ids),
                           "seconds": round(time.time() - t, 1)}
    print(f"tokenizer: {report['tokenizer']}", flush=True)
    tok_json = with_bos_post_processor(tok.to_str(pretty=True))
    windows = eval_windows(heldout_ids, args.seq, 16 if args.quick else 64)

    if args.draft_only:  # the target stage does not depend on the draft flags
        report["target"] = json.loads((out / "train_report.json").read_text())["target"]
    else:
        print("target:", flush=True)
        target = LlamaForCausalLM(llama_config(QUICK_TARGET if args.quick else TARGET,
                                               tok.get_vocab_size(), args.seq))
        report["target"] = {"params": sum(p.numel() for p in target.parameters()),
                            "steps": args.steps, "batch": args.batch, "seq": args.seq,
                            "lr": args.lr}
        report["target"]["seconds"] = round(train(target, train_ids, steps=args.steps,
                                                  batch=args.batch, seq=args.seq, lr=args.lr,
                                                  seed=args.seed), 1)
        report["target"]["heldout"] = heldout_metrics(target, windows)
        print(f"target: {report['target']}", flush=True)
        save_pair_member(target, tok_json, out / "target", torch.bfloat16, args.seq)
    # distil from exactly what ships: the BF16-rounded target
    target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    for prm in target.parameters():
        prm.requires_grad_(False)

    print("draft:", flush=True)
    torch.manual_seed(args.seed + 1)  # the draft's initial weights do not depend on the target run
    draft_shape = QUICK_DRAFT if args.quick else {**DRAFT, "num_hidden_layers": args.draft_layers}
    if args.draft_only and args.draft_steps == 0:  # keep OUT/draft: on-policy stage only
        draft = LlamaForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
        report["draft"] = json.loads((out / "train_report.json").read_text())["draft"]
        report["draft"].pop("onpolicy", None)
    else:
        draft = LlamaForCausalLM(llama_config(draft_shape, tok.get_vocab_size(), args.seq))
        report["draft"] = {"params": sum(p.numel() for p in draft.parameters()),
                           "steps": args.draft_steps, "batch": args.batch, "seq": args.seq,
                           "lr": args.draft_lr, "loss": "KL(target || draft)"}
        report["draft"]["seconds"] = round(train(draft, train_ids, steps=args.draft_steps,
                                                 batch=args.batch, seq=args.seq,
                                                 lr=args.draft_lr, seed=args.seed + 1,
                                                 teacher=target), 1)
        report["draft"]["heldout"] = heldout_metrics(draft, windows, teacher=target)
        print(f"draft: {report['draft']}", flush=True)
    if args.onpolicy_steps > 0:
        # 5. on-policy (sequence-level) distillation, as in DistillSpec (Zhou et al. 2023): at
        # decode time the draft predicts the target's own output, so fine-tune it there
        print("on-policy:", flush=True)
        t = time.time()
        lo, hi = (8, 32) if args.quick else (32, 128)
        new = (8, 16) if args.quick else (64, 128)
        seqs = onpolicy_sequences(target, tok, train_files, n=args.onpolicy_seqs,
                                  batch=args.onpolicy_batch, new_tokens=new, prefix=(lo, hi),
                                  seed=args.seed + 2)
        gen_s = time.time() - t
        n_seqs, n_tok = sum(len(s) for s, _, _ in seqs), sum(s.numel() for s, _, _ in seqs)
        print(f"  generated {n_seqs} sequences, {n_tok} tokens, {gen_s:.1f}s", flush=True)
        op = {"seqs": n_seqs, "tokens": n_tok,
              "prefix_tokens": [lo, hi], "new_tokens": list(new),
              "decoding": "half greedy, half temperature 1 (batches alternate)",
              "steps": args.onpolicy_steps, "batch": args.onpolicy_batch, "lr": args.onpolicy_lr,
              "loss": "KL(target || draft) on the target's generations"
                      + (f" + {args.onpolicy_ce} x CE(greedy continuations)"
                         if args.onpolicy_ce else ""),
              "generate_seconds": round(gen_s, 1)}
        op["train_seconds"] = round(train_onpolicy(draft, target, seqs, steps=args.onpolicy_steps,
                                                   lr=args.onpolicy_lr, seed=args.seed + 3,
                                                   ce=args.onpolicy_ce), 1)
        op["heldout"] = heldout_metrics(draft, windows, teacher=target)
        report["draft"]["onpolicy"] = op
        print(f"on-policy: {op}", flush=True)
    save_pair_member(draft, tok_json, out / "draft", torch.float16, args.seq)

    prompts = make_prompts(tok, heldout_files, per_file=3, n_max=100)
    (out / "prompts.json").write_text(json.dumps(
        {"about": "held-out prompts: whole lines from a def/class line of held-out stdlib files "
                  "(md5(path) % 20 == 0), 32-128 tokens without BOS; PSF licence",
         "prompts": prompts}, indent=1) + "\n")
    report["prompts"] = len(prompts)
    report["total_seconds"] = round(time.time() - t_start, 1)
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"prompts: {len(prompts)}; total {report['total_seconds']} s", flush=True)


if __name__ == "__main__":
    main()
