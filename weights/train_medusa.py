"""Train Medusa heads for the shipped target (Cai et al. 2024, Medusa-1: the target frozen).

Head k (k = 1..K) reads the target's last hidden state h_t (before the final norm) at position t
and predicts the token at t + 1 + k, one further than the target's own head does:

    logits_k = lm_head(final_norm(h_t + SiLU(W_k h_t + b_k)))

one residual block per head; the final norm and LM head are the target's own (tied to its
embedding), frozen and shared, so a head costs D x D + D parameters (0.26M here) and K = 4 heads
ship in 2.1 MB (F16). W_k starts at zero: each head starts as the target's own next-token head.

Data: the target's own continuations (half greedy, half sampled at temperature 1) of prefixes
cut from the training files, made by `weights/train.py`'s on-policy generator: at decode time
the heads predict what the target will say, not corpus text. Loss: for head k at position t,
KL(p_target(. | x_<=t+k) || head_k(h_t)), the target's own distribution for that token (self-
distillation, as in Medusa-2's recipe for heads without the original data), weighted 0.8^k.

Usage (from the repository root; needs torch and transformers)::

    python weights/train_medusa.py --out weights/medusa            # the shipped heads
    python weights/train_medusa.py --out /tmp/medusa --quick       # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "medusa"))
    ap.add_argument("--target", default=str(HERE / "target"))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=768, help="target continuations to train on")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few steps: a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.seqs, args.steps = 32, 5

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    import train as recipe  # the pair's recipe: corpus, on-policy generator, optimizer, schedule

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()
    target = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    tok = Tokenizer.from_file(str(Path(args.target) / "tokenizer.json"))
    train_files, _, _ = recipe.read_corpus(args.quick)

    t = time.time()
    seqs = recipe.onpolicy_sequences(target, tok, train_files, n=args.seqs, batch=16,
                                     new_tokens=(64, 160), prefix=(24, 96), seed=args.seed)
    print(f"data: {sum(s.shape[0] for s, _, _ in seqs)} continuations in "
          f"{time.time() - t:.0f} s", flush=True)

    D, K = target.config.hidden_size, args.heads
    W = torch.nn.Parameter(torch.zeros(K, D, D))  # [K, D_out, D_in]
    b = torch.nn.Parameter(torch.zeros(K, D))
    opt = torch.optim.AdamW([W, b], lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    weights = torch.tensor([0.8 ** k for k in range(1, K + 1)])
    captured = {}
    hook = target.model.layers[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    rng = np.random.default_rng(args.seed)
    t = time.time()
    for step in range(args.steps):
        lr = recipe.lr_at(step, args.steps, args.lr, max(1, args.steps // 20))
        for g in opt.param_groups:
            g["lr"] = lr
        seq, _, _ = seqs[int(rng.integers(len(seqs)))]
        x = seq[rng.choice(seq.shape[0], size=min(args.batch, seq.shape[0]), replace=False)]
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=x).logits, dim=-1)  # [B, T, V]
        h = captured["h"]  # [B, T, D]: the last layer's output, before the final norm
        T = x.shape[1]
        loss = 0.0
        for k in range(1, K + 1):
            hk = h[:, : T - k] + F.silu(h[:, : T - k] @ W[k - 1].T + b[k - 1])  # [B, T-k, D]
            logq = F.log_softmax(target.lm_head(target.model.norm(hk)), dim=-1)
            p_log = teacher[:, k:]  # the target's distribution for token t + 1 + k
            kl = (p_log.exp() * (p_log - logq)).sum(-1).mean()
            loss = loss + weights[k - 1] * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {lr:.2e}  "
                  f"{time.time() - t:.0f} s", flush=True)
    hook.remove()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k in range(K):
        tensors[f"medusa_head.{k}.weight"] = W[k].detach().to(torch.float16).contiguous()
        tensors[f"medusa_head.{k}.bias"] = b[k].detach().to(torch.float16).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    config = {"medusa_num_heads": K, "hidden_size": D, "base_model": "../target",
              "about": "Medusa-1 heads for the shipped target: head k (0-based) predicts the "
                       "token k + 2 positions after the hidden state it reads; "
                       "weights/train_medusa.py",
              "training": {"seqs": args.seqs, "steps": args.steps, "batch": args.batch,
                           "lr": args.lr, "seed": args.seed, "threads": args.threads,
                           "seconds": round(time.time() - t_start)}}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"wrote {out} in {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
