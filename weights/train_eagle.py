"""Train an EAGLE head for the shipped target (Li et al. 2024, EAGLE-1; the target frozen).

The head: fc [2D -> D] over (the target's feature f_j, the embedding of the token x_{j+1}),
then one Llama decoder layer of the target's own shape, whose output guesses f_{j+1}; the
target's final norm and LM head (frozen, shared) turn a guess into a distribution. Feature =
the last decoder layer's output, before the final norm (minispec's Model.hidden).

Data: the target's own continuations (half greedy, half sampled at temperature 1) of prefixes
cut from the training files (`weights/train.py`'s on-policy generator): at decode time the head
predicts what the target says. Loss, as in the paper: smooth-L1 regression of the guessed
feature onto the true one, plus the cross-entropy of the guessed feature's distribution against
the target's (soft labels; the paper weights it 0.1, but this target's features are large, the
regression term starting near 30, so the token term gets weight 1 to count); the input features
get a little uniform noise, as EAGLE does, so the head tolerates its own guesses when drafting
several tokens ahead.

Usage (from the repository root; needs torch and transformers)::

    python weights/train_eagle.py --out weights/eagle          # the shipped head
    python weights/train_eagle.py --out /tmp/eagle --quick     # a smoke run
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
    ap.add_argument("--out", default=str(HERE / "eagle"))
    ap.add_argument("--target", default=str(HERE / "target"))
    ap.add_argument("--seqs", type=int, default=768, help="target continuations to train on")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cls", type=float, default=1.0, help="weight of the token loss")
    ap.add_argument("--noise", type=float, default=0.05,
                    help="uniform input noise, as a fraction of the features' std")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None,
                    help="start from this head's weights (a directory this script wrote)")
    ap.add_argument("--quick", action="store_true", help="a few steps: a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.seqs, args.steps = 32, 5

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    sys.path.insert(0, str(HERE))
    import train as recipe  # the pair's recipe: corpus, on-policy generator, schedule

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

    tc = target.config
    D = tc.hidden_size
    shape = {"hidden_size": D, "num_attention_heads": tc.num_attention_heads,
             "num_key_value_heads": tc.num_key_value_heads, "head_dim": tc.head_dim,
             "intermediate_size": tc.intermediate_size, "rms_norm_eps": tc.rms_norm_eps,
             "rope_theta": 10000.0}
    layer = LlamaModel(LlamaConfig(
        vocab_size=8, num_hidden_layers=1, max_position_embeddings=tc.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False, mlp_bias=False, **{k: v for k, v in shape.items()
                                                 if k != "rope_theta"}))
    layer.norm = torch.nn.Identity()  # the output is a feature: before any final norm
    fc = torch.nn.Linear(2 * D, D)
    if args.init:  # continue a run: the weights this script saved (F16) as the start
        from safetensors.torch import load_file

        saved = load_file(str(Path(args.init) / "model.safetensors"))
        fc.load_state_dict({"weight": saved["fc.weight"].float(), "bias": saved["fc.bias"].float()})
        layer.layers.load_state_dict({k[len("model.layers."):]: v.float()
                                      for k, v in saved.items() if k.startswith("model.layers.")})
    params = [p for p in list(layer.parameters()) + list(fc.parameters()) if p.requires_grad]
    layer.embed_tokens.weight.requires_grad_(False)  # unused: the layer is fed inputs_embeds
    params = [p for p in params if p is not layer.embed_tokens.weight]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
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
            f = captured["h"]  # [B, T, D]: the features
            emb = target.model.embed_tokens(x[:, 1:])  # [B, T-1, D]: the shifted tokens
            noisy = f[:, :-1] + args.noise * f.std() * (2 * torch.rand_like(f[:, :-1]) - 1)
        guess = layer(inputs_embeds=fc(torch.cat([noisy, emb], dim=-1))).last_hidden_state
        reg = F.smooth_l1_loss(guess, f[:, 1:])
        logq = F.log_softmax(target.lm_head(target.model.norm(guess)), dim=-1)
        p_log = teacher[:, 1:]  # the target's distribution from the true feature f_{j+1}
        cls = (p_log.exp() * (p_log - logq)).sum(-1).mean()
        loss = reg + args.cls * cls
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  reg {reg.item():.4f}  kl {cls.item():.4f}  lr {lr:.2e}  "
                  f"{time.time() - t:.0f} s", flush=True)
    hook.remove()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"fc.weight": fc.weight, "fc.bias": fc.bias}
    for name, p in layer.layers.named_parameters():
        tensors[f"model.layers.{name}"] = p
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()},
              str(out / "model.safetensors"))
    config = {"eagle_version": 1, **shape, "base_model": "../target",
              "about": "EAGLE-1 head for the shipped target: fc over (feature, next token) and "
                       "one Llama decoder layer; weights/train_eagle.py",
              "training": {"init": args.init, "seqs": args.seqs, "steps": args.steps,
                           "batch": args.batch,
                           "lr": args.lr, "cls": args.cls, "noise": args.noise,
                           "seed": args.seed, "threads": args.threads,
                           "seconds": round(time.time() - t_start)}}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"wrote {out} in {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
