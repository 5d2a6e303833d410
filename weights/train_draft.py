"""Distil a small draft model for a Hugging Face Llama target from train_heads.py's data.

The classic drafter, for a target that ships without a small sibling (SmolLM2-135M is the
smallest SmolLM2): a few-layer Llama with the target's tokenizer, trained on the target's own
continuations (the ``--data-cache`` files ``train_heads.py`` writes: token sequences and the
target's last features) with forward KL(p_target || q_draft) at every position, p recomputed
from the cached features (final norm + LM head), as DistillSpec distils a draft on-policy.

* width: the token embedding dominates a small model with a 49,152-token vocabulary (256 x
  49,152 = 12.6M parameters of a ~14M model), so depth is nearly free: ``--layers 4`` costs
  about what one layer does per drafted token.
* initialisation: the embedding (tied to the LM head, as in the target) is the target's
  embedding projected on its top ``--hidden`` principal directions, so the model starts with
  the target's geometry of tokens instead of noise; the layers are random.
* evaluation: the greedy chain of 4 on the held-out greedy continuations (the first cache's
  held-out set), every start position, by kind (chat / code): the same estimate
  ``train_heads.py`` prints for its EAGLE head, so the two compare directly.

Usage (from the repository root; ``$S`` = the converted SmolLM2 directory, see weights/README)::

    D=/tmp/heads/big.pt,/tmp/heads/seed4.pt,/tmp/heads/seed5.pt  # train_heads.py's data
    python weights/train_draft.py --target $S --data-cache $D --epochs 1.7 --threads 2 \\
        --out /tmp/draftA                                            # 39 minutes
    python weights/train_draft.py --target $S --data-cache $D --init /tmp/draftA --epochs 1.5 \\
        --lr 1e-3 --seed 1 --threads 2 --out ~/.cache/minispec/smollm2-draft  # 31 minutes
    python -m minispec real drafters --draft ~/.cache/minispec/smollm2-draft \\
        --drafters model,eagle

Needs ``torch`` and ``transformers`` (``pip install -e .[train]``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", required=True, help="the target's Hugging Face Llama dir")
    ap.add_argument("--data-cache", required=True,
                    help="train_heads.py --data-cache file(s), comma-separated (the first "
                         "one's held-out set is evaluated)")
    ap.add_argument("--out", required=True, help="where the draft model's directory goes")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--epochs", type=float, default=3.0, help="passes over the training set")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="stop training after this long (0: no limit); the schedule is set "
                         "by --epochs")
    ap.add_argument("--init", default=None,
                    help="continue from a draft this script wrote (its shape: --hidden, "
                         "--layers, --intermediate and --head-dim are then ignored)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("hidden", "layers", "intermediate", "head_dim", "batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: expected a positive integer")
    if args.hidden % args.head_dim:
        raise SystemExit(f"--hidden {args.hidden}: expected a multiple of --head-dim "
                         f"{args.head_dim}")
    if not args.epochs > 0:
        raise SystemExit(f"--epochs: expected a positive number, got {args.epochs}")
    if args.init and not (Path(args.init) / "config.json").is_file():
        raise SystemExit(f"--init {args.init}: no config.json there (expected a directory "
                         "this script wrote)")
    caches = [Path(c) for c in args.data_cache.split(",")]
    missing = [str(c) for c in caches if not c.is_file()]
    if missing:
        raise SystemExit(f"--data-cache: {', '.join(missing)} not found (made by "
                         "weights/train_heads.py --data-cache FILE)")

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    import train as recipe  # the toy pair's recipe: optimizer and schedule
    from train_heads import padded

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    target = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    tc = target.config
    parts = [torch.load(c, weights_only=False) for c in caches]
    seqs = [s for d in parts for s, _ in d["train"]]
    feats = [f for d in parts for f in d["feats"]]
    evals = parts[0]["eval"]
    print(f"data: {len(seqs)} training sequences ({sum(len(s) for s in seqs)} tokens), "
          f"{len(evals)} held-out greedy ones, from {args.data_cache}", flush=True)

    # -- the student: the target's tokenizer and vocabulary, a few narrow layers ---------------
    if args.init:
        draft = LlamaForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        if draft.config.vocab_size != tc.vocab_size:
            raise SystemExit(f"--init {args.init}: vocab_size {draft.config.vocab_size}, "
                             f"expected the target's {tc.vocab_size}")
        cfg = draft.config
    else:
        rope = getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                        "rope_theta": getattr(tc, "rope_theta",
                                                                              10000.0)}
        cfg = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=args.hidden,
                          intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                          num_attention_heads=args.hidden // args.head_dim,
                          num_key_value_heads=args.hidden // args.head_dim, head_dim=args.head_dim,
                          max_position_embeddings=tc.max_position_embeddings,
                          rms_norm_eps=tc.rms_norm_eps, rope_parameters=rope,
                          tie_word_embeddings=True, bos_token_id=tc.bos_token_id,
                          eos_token_id=tc.eos_token_id, attention_bias=False, mlp_bias=False)
        draft = LlamaForCausalLM(cfg)
        E = target.model.embed_tokens.weight.detach()
        with torch.no_grad():  # the target's embedding on its top principal directions
            _, _, Vh = torch.linalg.svd(E - E.mean(0), full_matrices=False)
            k = min(args.hidden, Vh.shape[0])  # a draft wider than the target: the rest random
            draft.model.embed_tokens.weight[:, :k] = E @ Vh[:k].T
    n_params = sum(p.numel() for p in draft.parameters())
    print(f"draft: {cfg.num_hidden_layers} layers x {cfg.hidden_size}, {n_params / 1e6:.1f}M "
          f"parameters{', from ' + args.init if args.init else ''}", flush=True)

    W, norm = target.lm_head.weight.detach(), target.model.norm

    def teacher(f):  # the target's next-token log-distribution from its cached features
        with torch.no_grad():
            return F.log_softmax((norm(f) @ W.T).float(), -1)

    # -- training: length-bucketed batches, forward KL at every real position ----------------
    lengths = np.array([len(s) for s in seqs])
    per_epoch = (len(seqs) + args.batch - 1) // args.batch
    plan = []
    while len(plan) < int(args.epochs * per_epoch):
        order = np.argsort(lengths + rng.random(len(seqs)) * 8, kind="stable")
        batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
        plan += [list(batches[i]) for i in rng.permutation(len(batches))]
    plan = plan[: int(args.epochs * per_epoch)]
    opt = recipe.adamw(draft, args.lr)
    warmup = max(1, len(plan) // 20)
    t, ntok, done = time.time(), 0, 0
    draft.train()
    for step, idx in enumerate(plan):
        if args.minutes and time.time() - t > 60 * args.minutes:
            print(f"stopped at step {step}/{len(plan)}: --minutes {args.minutes}", flush=True)
            break
        for g in opt.param_groups:
            g["lr"] = recipe.lr_at(step, len(plan), args.lr, warmup)
        x, f, lens = padded(seqs, feats, idx)
        mask = (torch.arange(x.shape[1])[None] < lens[:, None]).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            p_log = teacher(f)
            logq = F.log_softmax(draft(input_ids=x).logits.float(), -1)
        kl = ((p_log.exp() * (p_log - logq)).sum(-1) * mask).sum() / mask.sum()
        kl.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ntok += int(mask.sum())
        done = step + 1
        if step % 50 == 0 or step == len(plan) - 1:
            dt = time.time() - t
            print(f"step {step:5d}/{len(plan)}  kl {kl.item():.3f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {dt:6.0f} s  {ntok / dt:5.0f} tok/s",
                  flush=True)
    train_s = round(time.time() - t)

    # -- held-out greedy chain of 4: draft context n guesses x_n .. x_{n+3} --------------------
    draft.eval()
    from tokenizers import Tokenizer

    tok_file = Path(args.target) / "tokenizer.json"  # a chat sequence starts with <|im_start|>
    im_start = Tokenizer.from_file(str(tok_file)).token_to_id("<|im_start|>") \
        if tok_file.is_file() else None
    totals = {}
    eval_seqs = [s for s, _ in evals]
    no_feats = [torch.zeros(len(s), 1) for s in eval_seqs]  # padded() wants features: unused
    with torch.no_grad():
        for lo in range(0, len(evals), 8):
            idx = list(range(lo, min(lo + 8, len(evals))))
            x, _, lens = padded(eval_seqs, no_feats, idx)
            guess = draft(input_ids=x).logits.argmax(-1)  # [B, T]: position j guesses x_{j+1}
            T = x.shape[1]
            C = T - 4  # context lengths n = 1 .. T-4
            match = torch.stack([guess[:, s:s + C] == x[:, s + 1:s + 1 + C] for s in range(4)])
            accepted = torch.cumprod(match.float(), 0).sum(0)  # [B, C]
            n = torch.arange(1, C + 1)[None]
            for r, i in enumerate(idx):
                L = evals[i][1]
                ok = (n[0] >= L) & (n[0] + 3 < lens[r])
                kind = "chat" if im_start is not None and eval_seqs[i][0] == im_start else "code"
                for k in ("all", kind):
                    a = totals.setdefault(k, [0.0, 0])
                    a[0] += float(accepted[r][ok].sum())
                    a[1] += int(ok.sum())
    rates = {k: round(a / max(n, 1), 4) for k, (a, n) in totals.items()}
    print(f"draft: greedy chain of 4 on held-out continuations: {rates.get('all', 0):.3f} "
          f"accepted per round ({totals.get('all', [0, 0])[1]} rounds); "
          + ", ".join(f"{k} {v:.3f}" for k, v in rates.items() if k != "all"), flush=True)

    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (Path(args.target) / name).is_file():
            shutil.copy(Path(args.target) / name, out / name)
    (out / "training.json").write_text(json.dumps({
        "about": "draft model distilled by weights/train_draft.py", "target": args.target,
        "data": args.data_cache, "steps": done, "planned_steps": len(plan),
        "train_s": train_s, "total_s": round(time.time() - t0), "chain4_accepted": rates,
        "args": vars(args)}, indent=1) + "\n")
    print(f"wrote {out} ({done} steps, {train_s} s of training)", flush=True)


if __name__ == "__main__":
    main()
