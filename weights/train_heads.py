"""Train an EAGLE head and Medusa heads for a frozen Llama target, on the target's own output.

One recipe for any Hugging Face Llama directory: the shipped toy target (`weights/target`) and
SmolLM2-135M-Instruct (converted by `python -m minispec real`) are the two it was run on.

1. **Data** (self-distillation): the target continues prompts with its KV cache (`generate`,
   batches, alternately greedy and sampled at temperature 1), so the heads learn what the target
   will say. Prompts: `--data code`: prefixes of the stdlib TRAINING files (`train.py`'s
   on-policy generator, as the toy target's draft was trained); `--data chat`: ChatML requests
   built here from templates x topics, "Write a Python function: <docstring first line>" from
   the training files' functions, and raw code prefixes of the training files. Nothing of
   minispec/real.py's benchmark prompts is used (`BENCH_WORDS` filters the training prompts), and
   a few templates, topics and the held-out stdlib files are kept for an unseen evaluation.
   `--data mix`: requests in the kinds of minispec's four workloads (`MIX`: chat, code to
   complete, code to edit, a text to answer from), for data made in bulk on a GPU
   (`--device cuda`, `--gen-seconds`; weights/gpu_heads.sh runs it).
2. **Features**, computed once: the last decoder layer's output BEFORE the final norm (a forward
   hook on model.model.layers[-1]: `output_hidden_states[-1]` is after the norm), kept in memory
   in F16; training never reruns the target. The target's distribution at a position is
   lm_head(norm(feature)), recomputed per batch from the feature (cheap: one matmul).
3. **Draft vocabulary** (FR-Spec, `--draft-vocab N`): the N tokens most frequent in the generated
   continuations (plus the EOS ids; ties broken by the prompts' tokens). A head's logits are
   computed only over those rows of the target's LM head (q is 0 elsewhere); the loss is
   KL(p || q) with p the target's distribution restricted to the cut and renormalised.
   `--draft-vocab 0` keeps the whole vocabulary.
4. **EAGLE** (Li et al. 2024; EAGLE-3's training-time test): fc [2D -> D] over (feature f_i,
   embedding of x_{i+1}), one Llama decoder layer of the target's shape and RoPE theta, whose
   output g_{i+1} guesses f_{i+1}; the target's final norm and (cut) LM head give q. With
   `--ttt K` the head is unrolled K steps. Step 0 reads the true features. Step s reads, at
   position i, the guess step s-1 made there (g^{s-1}_i, made at i-1: the step-(s-1) output
   shifted by one position) with the true token x_{i+1}: along a chain whose drafts were all
   accepted these are exactly the head's inputs when drafting s+1 tokens ahead. Attention is
   what drafting sees: the query of step s at position i attends to the step-0 keys of positions
   <= i - s (made from true features: the context) and to the keys of step t at position
   i - s + t, t = 1..s (the chain's own guesses), each at its own RoPE position (EAGLE-3's
   mask; a plain causal mask over the step-s sequence would let it attend to guessed keys at
   positions where drafting has true ones). Loss on every step s at positions i >= s:
   KL(p_target(f_{i+1}) || q(g^s_{i+1})) + `--reg` x smooth-L1(g^s_{i+1}, f_{i+1})
   (+ `--ce` x the cross-entropy of the target's argmax: it sharpens q, which greedy drafts like
   and sampled ones do not; the toy head's run 6 dropped it). `--fc-gains F,T` multiplies fc's
   feature and token inputs in training (folded into the saved weight): a per-half learning rate.
5. **Medusa** (Cai et al. 2024, Medusa-1): K residual heads h + SiLU(W_k h + b_k) on the
   feature h_t (W_k starts at 0), target's final norm and (cut) LM head; head k (0-based)
   guesses x_{t+2+k}: loss KL(p_target(f_{t+1+k}) || q_k), weighted 0.8^k.
6. **Evaluation** in torch on held-out prompts' greedy continuations: the greedy chain
   acceptance, how many of a 4-token argmax chain match the target's greedy tokens (each start
   position), and the draft vocabulary's coverage of those tokens. A run from `--init-eagle`
   gives its starting head's figure first, on the same set; `--eagle-epochs 0` (and
   `--medusa-epochs 0` with `--init-medusa`) measures a saved head and trains nothing.

Files (what minispec/drafters/eagle.py and medusa.py read), F16: EAGLE config.json (layer shape,
rope_theta, "target": {model_type, hidden_size, num_hidden_layers, vocab_size}, optional
"draft_vocab_size") + model.safetensors (fc.weight [D, 2D], fc.bias, model.layers.0.*, optional
"draft_vocab" int64 [N]); Medusa config.json (medusa_num_heads, hidden_size, target, ...) +
medusa_head.{k}.weight [D, D] (out x in), medusa_head.{k}.bias, optional "draft_vocab".

Usage (from the repository root; needs torch and transformers)::

    python weights/train_heads.py --target weights/target --out-eagle weights/eagle \
        --out-medusa weights/medusa                                      # the toy target
    python weights/train_heads.py --target ~/.cache/minispec/smollm2-135m-instruct --data chat \
        --draft-vocab 8192 --out-eagle weights/smollm2/eagle --out-medusa weights/smollm2/medusa
    python weights/train_heads.py --quick --out-eagle /tmp/e --out-medusa /tmp/m   # smoke run
    bash weights/gpu_heads.sh      # SmolLM2's shipped heads, on a GPU (--device cuda --data mix)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # ChatML, as minispec real

# words of minispec/real.py's benchmark prompts: no training prompt may contain one
BENCH_WORDS = ("capital", "france", "fibonacci", "past tense", "cat sits", "sky", "prime",
               "json", "config")
TEMPLATES = ["Explain {} to a beginner.", "Write a short story about {}.",
             "Give three tips for {}.", "Summarize what you know about {}.",
             "What are the advantages and disadvantages of {}?", "Write a poem about {}.",
             "Describe {} in a few sentences.", "Why is {} important?",
             "List five facts about {}.", "Write a Python function that works with {}.",
             "Compare {} with something similar.", "What is the history of {}?",
             "Write a short dialogue between two people about {}.",
             "What are common mistakes people make with {}?", "Teach me about {} step by step.",
             "Write a blog post introduction about {}."]
TOPICS = ["photosynthesis", "the water cycle", "volcanoes", "black holes", "the Roman Empire",
          "machine learning", "climate change", "healthy eating", "learning a new language",
          "public speaking", "time management", "the stock market", "electric cars",
          "the human heart", "vaccines", "the internet", "recycling", "honey bees", "chess",
          "the moon landing", "earthquakes", "sleep", "coffee", "friendship", "gardening",
          "renewable energy", "the printing press", "dinosaurs", "the immune system",
          "sorting algorithms", "linked lists", "binary search", "hash tables", "recursion",
          "regular expressions", "databases", "unit testing", "version control", "compilers",
          "operating systems", "a rainy day", "a lost dog", "a lighthouse keeper", "a robot",
          "a small village", "the ocean", "mountains", "running a marathon", "saving money",
          "writing an essay", "cooking pasta", "traveling on a budget", "the French Revolution",
          "Shakespeare", "the piano", "basketball", "rainforests", "glaciers", "bicycles",
          "strings and lists in Python", "the Industrial Revolution", "quantum computing",
          "tea ceremonies", "the Olympic Games", "photography", "origami", "whales", "deserts",
          "the Renaissance", "jazz music", "the stock exchange", "nuclear power", "bread baking",
          "meditation", "mountain climbing", "the periodic table", "ancient Egypt", "the Vikings",
          "smartphones", "social media", "electricity", "magnets", "rivers", "tornadoes",
          "coral reefs", "butterflies", "owls", "the Amazon river", "the Silk Road",
          "chocolate", "volunteering", "job interviews", "remote work", "budgeting apps",
          "classical music", "painting with watercolors", "knitting", "camping", "surfing",
          "soccer", "tennis", "board games", "video games", "a space station", "a dragon",
          "a time traveler", "a small bakery", "a train journey", "an old library",
          "graph algorithms", "dynamic programming", "object-oriented programming",
          "functional programming", "web servers", "CSV files",
          "error handling in Python", "Python decorators", "list comprehensions",
          "binary trees", "stacks and queues", "big-O notation", "the command line",
          "computer networks", "encryption", "password security", "cloud computing",
          "open source software", "spreadsheets", "probability", "statistics", "geometry",
          "fractions", "the Pythagorean theorem", "evolution", "DNA", "the brain",
          "bacteria", "the weather", "rainbows", "the seasons", "ocean tides", "the Sahara",
          "Antarctica", "the Himalayas", "democracy", "the printing of money", "inflation",
          "entrepreneurship", "marketing", "teamwork", "leadership", "kindness", "habits",
          "procrastination", "reading books", "writing poetry", "learning to swim"]
HELD_TEMPLATES = ["How would you teach {} to a child?", "Write a letter to a friend about {}."]
HELD_TOPICS = ["the solar system", "penguins", "matrix multiplication", "a haunted house",
               "the Great Wall of China", "yoga"]


def bench_free(text: str) -> bool:
    low = text.lower()
    return not any(w in low for w in BENCH_WORDS)


def docstring_lines(files, limit: int) -> list[str]:
    """First lines of function docstrings (20-100 characters) from the given files."""
    out = []
    for _, text in files:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
                if 20 <= len(doc) <= 100 and bench_free(doc):
                    out.append(doc)
        if len(out) >= limit:
            break
    return out[:limit]


def code_prefixes(files, rng, n: int) -> list[str]:
    """n raw code prefixes: 2-12 whole lines from a def/class line of the given files."""
    starts = []
    for _, text in files:
        lines = text.splitlines(keepends=True)
        starts += [(lines, i) for i, s in enumerate(lines) if s.lstrip().startswith(("def ",
                                                                                   "class "))]
    out = []
    for j in rng.permutation(len(starts))[: 3 * n]:
        lines, i = starts[j]
        text = "".join(lines[i:i + int(rng.integers(2, 12))])
        if 40 <= len(text) <= 500 and bench_free(text):
            out.append(text)
        if len(out) == n:
            break
    return out


def chat_prompts(train_files, heldout_files, n: int, n_eval: int, rng):
    """(training prompts, held-out prompts) as text: 1/2 templates x topics, 1/6 docstring
    requests, 1/3 raw code prefixes; the held-out ones from other templates/topics and from the
    held-out files."""
    pairs = [t.format(x) for t in TEMPLATES for x in TOPICS]
    pairs = [CHAT.format(p) for p in pairs if bench_free(p)]
    docs = [CHAT.format("Write a Python function: " + d) for d in docstring_lines(train_files, n)]
    code = code_prefixes(train_files, rng, n // 3)
    pick = (list(rng.permutation(pairs))[: n // 2] + list(rng.permutation(docs))[: n // 6]
            + code)
    held = [CHAT.format(t.format(x)) for t in HELD_TEMPLATES for x in HELD_TOPICS]
    held = list(rng.permutation(held))[: (2 * n_eval) // 3]
    held += code_prefixes(heldout_files, rng, n_eval - len(held))
    return [str(p) for p in rng.permutation(pick)], [str(p) for p in held]


# --data mix: requests in the four workloads' kinds (minispec/workloads.py), built on the stdlib
# training files: code to complete, code to edit, a text to answer from, and chat
CODE_ASKS = ["Complete this Python function.", "Complete this Python code.",
             "Finish writing this code."]
EDIT_ASKS = ["Add type hints to this function.", "Add a docstring to this function.",
             "Add comments to this code.", "Rewrite this function with clearer variable names.",
             "Explain what this code does.", "Make this function shorter without changing what "
             "it does.", "Rewrite this code in a simpler way.", "Find the bugs in this code and "
             "fix them.", "Rename the parameters of this function to longer, clearer names."]
TEXT_ASKS = ["Summarize this text in one sentence.", "List the key terms this text uses, one per "
             "line.", "Rewrite this text as a bulleted list.", "Quote the most important "
             "sentence of this text.", "Rewrite this text in simpler words.", "Correct the "
             "grammar of this text.", "List every function, class or parameter name this text "
             "mentions, one per line.", "What does this text say is returned? Answer from the "
             "text only.", "Turn this text into two questions and their answers.",
             "Rewrite this text in a friendly tone."]
MIX = {"chat": 0.35, "docs": 0.10, "code": 0.20, "edit": 0.15, "grounded": 0.20}


def code_pieces(files, limit: int) -> tuple[list[str], list[str]]:
    """(small whole functions of 4-25 lines, docstrings of 150-800 characters) from the files."""
    funcs, docs = [], []
    for _, text in files:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                doc = (ast.get_docstring(node) or "").strip()
                if 150 <= len(doc) <= 800 and bench_free(doc):
                    docs.append(doc)
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno < 25:
                body = lines[node.lineno - 1:node.end_lineno]
                indent = len(body[0]) - len(body[0].lstrip())
                code = "\n".join(v[indent:] for v in body)
                if 60 <= len(code) <= 800 and bench_free(code):
                    funcs.append(code)
        if len(funcs) >= limit and len(docs) >= limit:
            break
    return funcs, docs


def mix_prompts(train_files, heldout_files, n: int, n_eval: int, rng):
    """(training prompts, their sampled flags, held-out prompts) as text for --data mix: the
    shares of MIX of chat requests (templates x topics), "Write a Python function:" requests,
    code to complete (half raw prefixes, half ChatML requests), code to edit and a docstring to
    answer from (ChatML requests). Each distinct prompt comes once, alternately greedy and
    sampled at T = 1; a kind with fewer distinct prompts than its share repeats them, sampled.
    The held-out prompts are chat_prompts' (other templates and topics, held-out files)."""
    pairs = [CHAT.format(t.format(x)) for t in TEMPLATES for x in TOPICS]
    funcs, docs = code_pieces(train_files, n)
    pools = {
        "chat": [p for p in pairs if bench_free(p)],
        "docs": [CHAT.format("Write a Python function: " + d)
                 for d in docstring_lines(train_files, n)],
        "code": [c if j % 2 else CHAT.format(f"{CODE_ASKS[j % 3]}\n\n```python\n{c}```")
                 for j, c in enumerate(code_prefixes(train_files, rng, n))],
        "edit": [CHAT.format(f"{EDIT_ASKS[int(rng.integers(len(EDIT_ASKS)))]}\n\n{c}")
                 for c in funcs],
        "grounded": [CHAT.format(f"{TEXT_ASKS[int(rng.integers(len(TEXT_ASKS)))]}\n\n{d}")
                     for d in docs]}
    prompts, flags = [], []
    for kind, share in MIX.items():
        pool = [str(p) for p in rng.permutation(list(dict.fromkeys(pools[kind])))]
        if not pool:
            print(f"--data mix: no {kind} prompts in these files", flush=True)
            continue
        want = round(share * n)
        for j in range(want):
            prompts.append(pool[j % len(pool)])
            flags.append(j >= len(pool) or j % 2 == 1)
    order = rng.permutation(len(prompts))
    held = [CHAT.format(t.format(x)) for t in HELD_TEMPLATES for x in HELD_TOPICS]
    held = list(rng.permutation(held))[: (2 * n_eval) // 3]
    held += code_prefixes(heldout_files, rng, n_eval - len(held))
    return ([prompts[i] for i in order], [flags[i] for i in order],
            [str(p) for p in held])


def generate(target, prompts, *, batch: int, new_tokens: int, eos, pad: int, seed: int,
             greedy_only: bool = False, sampled_only: bool = False, sampled=None,
             seconds: float | None = None):
    """The target's continuations of `prompts` (lists of ids) -> list of (int64 array of
    prompt + continuation up to its first EOS, prompt length). Batches alternate greedy /
    sampled at T=1 (only greedy with greedy_only, only sampled with sampled_only); prompts are
    left-padded within a batch.

    With `sampled` (one flag per prompt: sample it at T = 1, else greedy) the batches alternate
    between the two groups, each taken in the prompts' order and sorted by length only within
    a window of 8 batches; with `seconds`, no batch starts after that many seconds, so a
    deadline keeps the mix of prompt kinds that the order has."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    if sampled is None:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # little padding
        plan = [(order[lo:lo + batch], sampled_only or (not greedy_only and b % 2 == 1))
                for b, lo in enumerate(range(0, len(order), batch))]
    else:
        groups = []
        for flag in (False, True):
            group, batches = [i for i in range(len(prompts)) if bool(sampled[i]) == flag], []
            for lo in range(0, len(group), 8 * batch):
                window = sorted(group[lo:lo + 8 * batch], key=lambda i: len(prompts[i]))
                batches += [(window[j:j + batch], flag) for j in range(0, len(window), batch)]
            groups.append(batches)
        greedy, samples = groups  # alternately, then what is left of the longer
        plan = [b for pair in zip(greedy, samples) for b in pair]
        n = min(len(greedy), len(samples))
        plan += greedy[n:] + samples[n:]
    out, t0 = [], time.time()
    for idx, sample in plan:
        if seconds is not None and out and time.time() - t0 > seconds:
            break  # (the first batch always runs)
        rows = [prompts[i] for i in idx]
        L = max(len(r) for r in rows)
        x = torch.tensor([[pad] * (L - len(r)) + r for r in rows], dtype=torch.int64)
        mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
        cfg = GenerationConfig(max_new_tokens=new_tokens, do_sample=sample,
                               temperature=1.0 if sample else None, top_k=0 if sample else None,
                               top_p=1.0 if sample else None, eos_token_id=list(eos) or None,
                               pad_token_id=pad, use_cache=True)
        with torch.no_grad():
            seq = target.generate(input_ids=x, attention_mask=mask, generation_config=cfg)
        for r, row in zip(rows, seq[:, L:].cpu().numpy()):
            stop = [j for j, t in enumerate(row) if t in eos]
            cont = row[: stop[0] + 1] if stop else row
            out.append((np.array(list(r) + list(cont), dtype=np.int64), len(r)))
    return out


def features(target, seqs, batch: int = 8):
    """The last decoder layer's output before the final norm for each sequence -> list of F16
    tensors [L, D] (right-padded batches: attention is causal, so padding changes nothing)."""
    import torch

    captured = {}
    hook = target.model.layers[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    out = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    try:
        for lo in range(0, len(order), batch):
            idx = order[lo:lo + batch]
            L = max(len(seqs[i]) for i in idx)
            x = torch.zeros(len(idx), L, dtype=torch.int64)
            for r, i in enumerate(idx):
                x[r, : len(seqs[i])] = torch.from_numpy(seqs[i])
            with torch.no_grad():
                target.model(input_ids=x)
            for r, i in enumerate(idx):
                out[i] = captured["h"][r, : len(seqs[i])].to(torch.float16).clone()
    finally:
        hook.remove()
    return out


def padded(seqs, feats, idx):
    """A batch: tokens [B, T], features [B, T, D] (float32), lengths [B]."""
    import torch

    T = max(len(seqs[i]) for i in idx)
    D = feats[idx[0]].shape[1]
    x = torch.zeros(len(idx), T, dtype=torch.int64)
    f = torch.zeros(len(idx), T, D)
    for r, i in enumerate(idx):
        x[r, : len(seqs[i])] = torch.from_numpy(seqs[i])
        f[r, : len(seqs[i])] = feats[i].float()
    return x, f, torch.tensor([len(seqs[i]) for i in idx])


def build_layer(shape: dict):
    """One Llama decoder layer with Hugging Face's parameter names, and a forward that takes the
    keys/values of earlier unrolled steps with a mask (EAGLE-3's training-time test)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    D, H, KV, hd = (shape["hidden_size"], shape["num_attention_heads"],
                    shape["num_key_value_heads"], shape["head_dim"])
    eps, theta, inter = shape["rms_norm_eps"], shape["rope_theta"], shape["intermediate_size"]

    def linear(i, o):
        m = nn.Linear(i, o, bias=False)
        nn.init.normal_(m.weight, std=0.02)
        return m

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = linear(D, H * hd), linear(D, KV * hd)
            self.v_proj, self.o_proj = linear(D, KV * hd), linear(H * hd, D)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = linear(D, inter), linear(D, inter)
            self.down_proj = linear(inter, D)

    def rope(x, cos, sin):  # Hugging Face Llama's rotate-half convention
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.RMSNorm(D, eps=eps)
            self.self_attn = Attn()
            self.post_attention_layernorm = nn.RMSNorm(D, eps=eps)
            self.mlp = MLP()
            inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
            self.register_buffer("inv_freq", inv, persistent=False)

        def kv_q(self, x):
            """(q [B, H, T, hd], k, v [B, KV, T, hd]) of x [B, T, D] at positions 0..T-1."""
            B, T, _ = x.shape
            ang = torch.arange(T, dtype=torch.float32)[:, None] * self.inv_freq[None]
            cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
            h = self.input_layernorm(x)
            a = self.self_attn
            q = a.q_proj(h).view(B, T, H, hd).transpose(1, 2)
            k = a.k_proj(h).view(B, T, KV, hd).transpose(1, 2)
            v = a.v_proj(h).view(B, T, KV, hd).transpose(1, 2)
            return rope(q, cos, sin), rope(k, cos, sin), v

        def finish(self, x, q, keys, values, mask):
            """The rest of the layer: attention of q over keys/values [B, KV, S, hd] under mask
            [T, S] (True = may attend), then the MLP, both residual."""
            B, T, _ = x.shape
            k = keys.repeat_interleave(H // KV, dim=1)
            v = values.repeat_interleave(H // KV, dim=1)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + self.self_attn.o_proj(att.transpose(1, 2).reshape(B, T, H * hd))
            m = self.mlp
            h = self.post_attention_layernorm(x)
            return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))

    return Layer()


def gained_linear(n_in: int, n_out: int, gains):
    """EAGLE's fc [n_in -> n_out] whose two input halves (feature, token embedding) are first
    multiplied by gains[0] and gains[1]. The saved weight folds them in (saved_weight), so minispec
    reads a plain fc; in training a gain scales that half's learning rate under Adam. A feature's
    scale is far above an embedding's (rms ~35 against ~0.03 for the toy target, ~73 against
    ~0.14 for SmolLM2), so with gains 1, 1 the token half, whose weights must grow hundreds of
    times larger than the feature half's for the token to be heard, learns slowest."""
    import torch

    class Gained(torch.nn.Linear):
        def __init__(self):
            super().__init__(n_in, n_out)
            half = n_in // 2
            self.register_buffer("gain", torch.tensor([gains[0]] * half + [gains[1]] * half),
                                 persistent=False)

        def forward(self, z):
            return super().forward(z * self.gain)

        def saved_weight(self):
            return self.weight * self.gain

        def load_saved(self, weight, bias):
            with torch.no_grad():
                self.weight.copy_(weight / self.gain)
                self.bias.copy_(bias)

    return Gained()


def save_eagle(out: Path, layer, fc, shape: dict, fields: dict, extra=None) -> None:
    """Write an EAGLE head as minispec/drafters/eagle.py reads it: model.safetensors (F16: fc with
    its gains folded in, the layer under model.layers.0.*, + `extra` tensors such as the draft
    vocabulary) and config.json (the layer's shape + `fields`)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {"fc.weight": fc.saved_weight(), "fc.bias": fc.bias}
    for name, p in layer.named_parameters():
        tensors[f"model.layers.0.{name}"] = p
    tensors = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in tensors.items()}
    save_file({**tensors, **(extra or {})}, str(out / "model.safetensors"))
    config = {"eagle_version": 1, **shape, **fields}
    (out / "config.json").write_text(config_text(config))


def config_text(config: dict) -> str:
    """config.json's text: indented, a list of numbers on one line."""
    text = json.dumps(config, indent=1)
    return re.sub(r"\[([^\[\]{}\"]*)\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
                  text) + "\n"


def ttt_mask(T: int, s: int):
    """Step s's mask over the keys of steps 0..s ([T, (s+1)T]): step-0 keys at positions
    <= i - s, and the key of step t at position i - s + t (the chain drafting sees)."""
    import torch

    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    blocks = [j <= i - s] + [j == i - s + t for t in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def eagle_unroll(layer, fc, embed, f, x, steps: int, noise: float = 0.0):
    """The head unrolled `steps` steps over features f [B, T, D] and tokens x [B, T] -> list of
    guesses [B, T-1, D], one per step (row i of step s: g^s_{i+1}, the guess of f_{i+1})."""
    import torch

    emb = embed(x[:, 1:])  # the token each input position pairs with: x_{i+1}
    feat = f[:, :-1]
    if noise:
        feat = feat + noise * f.std() * (2 * torch.rand_like(feat) - 1)
    keys, values, out = [], [], []
    T = feat.shape[1]
    for s in range(steps):
        a = fc(torch.cat([feat, emb], dim=-1))
        q, k, v = layer.kv_q(a)
        keys.append(k)
        values.append(v)
        g = layer.finish(a, q, torch.cat(keys, 2), torch.cat(values, 2), ttt_mask(T, s))
        out.append(g)
        # step s+1 at position i reads g^s_i (made at position i - 1); position 0 keeps f_0
        feat = torch.cat([f[:, :1], g[:, :-1]], dim=1)
    return out


# the head's confidence (its top probability) binned at these upper edges for `acceptance`
CONFIDENCE_EDGES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
RANKS = 4  # a tree candidate's rank in the head's distribution, for `acceptance`'s by_rank


def acceptance(layer, fc, embed, norm, lm_head, cut, seqs, feats, starts, steps: int = 4,
               sampled_text: bool = False):
    """How often an EAGLE head's drafts are kept, by its confidence (its top probability, in
    CONFIDENCE_EDGES bins), on the target's continuations `seqs` (with their features; generated
    text from index `starts[i]`) -> rates for the "acceptance" field of the head's config.json
    (`calibrate` picks them), which its stop rule and dynamic tree read (drafters/eagle.py).

    Per chain step s (0-based): "greedy", the fraction of drafts equal to the target's argmax (a
    greedy draft's chance); "sampled", the mean 1 - TV(p, q) = sum_x min(p(x), q(x)) (a draft
    sampled from q at T = 1). Per rank r of a tree's top-k candidates (all steps together):
    "greedy_by_rank", how often the rank-r token is the target's argmax; "sampled_by_rank", the
    target's mean probability of it (a one-hot candidate's chance at T = 1).

    A start counts at step s only as far as a chain gets there: on greedy text, 1 if every
    earlier step matched, else 0 (in the tree: the target's token among the top RANKS); with
    `sampled_text` (continuations sampled at T = 1), the product of the earlier steps' 1 - TV
    (in the tree: of the target's probability of the top RANKS). Rates are made monotone in the
    confidence (weighted isotonic regression: the chain's and rank 1's non-decreasing, other
    ranks' non-increasing); an empty bin takes its neighbours' rate."""
    import torch
    from scipy.optimize import isotonic_regression

    K, R = len(CONFIDENCE_EDGES), RANKS
    edges = torch.tensor(CONFIDENCE_EDGES)
    count, hit, kept = (torch.zeros(steps, K, dtype=torch.float64) for _ in range(3))
    tried, rank_hit, rank_p = (torch.zeros(R, K, dtype=torch.float64) for _ in range(3))
    w_cut = lm_head[cut]  # [N, D]
    with torch.no_grad():
        for lo in range(0, len(seqs), 8):
            idx = list(range(lo, min(lo + 8, len(seqs))))
            x, f, lens = padded(seqs, feats, idx)
            C = x.shape[1] - steps - 1  # chain starts c: context x_0..x_{c+1}
            if C <= 0:
                continue
            outs = eagle_unroll(layer, fc, embed, f, x, steps)
            c = torch.arange(C)[None]
            start = torch.tensor([starts[i] for i in idx])[:, None]
            # the weight each start counts with at this step: 1 / 0 (greedy text: valid and
            # every earlier step matched), or the chance a sampled chain got here
            reach = ((c + 2 >= start) & (c + steps + 1 < lens[:, None])).double()  # [B, C]
            in_tree = reach.clone()
            for s, g in enumerate(outs):  # step s at start c guesses x_{c+s+2}
                logq = torch.log_softmax(norm(g[:, s:s + C]) @ w_cut.T, dim=-1)  # [B, C, N]
                conf, top = logq.max(-1)
                conf = conf.exp()
                y = x[:, s + 2:s + 2 + C]
                match = (cut[top] == y).double()
                logp = torch.log_softmax(norm(f[:, s + 1:s + 1 + C]) @ lm_head.T, dim=-1)
                keep = torch.minimum(logp[..., cut], logq).exp().sum(-1).double()  # 1 - TV
                b = torch.bucketize(conf, edges).clamp(max=K - 1).flatten()
                count[s].index_add_(0, b, reach.flatten())
                hit[s].index_add_(0, b, (match * reach).flatten())
                kept[s].index_add_(0, b, (keep * reach).flatten())
                reach = reach * (keep if sampled_text else match)
                ranked = cut[logq.topk(R, dim=-1).indices]  # [B, C, R] token ids
                p_top = logp.gather(-1, ranked).exp().double()  # [B, C, R]
                for r in range(R):
                    tried[r].index_add_(0, b, in_tree.flatten())
                    rank_hit[r].index_add_(0, b, ((ranked[..., r] == y) * in_tree).flatten())
                    rank_p[r].index_add_(0, b, (p_top[..., r] * in_tree).flatten())
                in_tree = in_tree * (p_top.sum(-1) if sampled_text
                                     else (ranked == y[..., None]).any(-1).double())

    def smooth(total, n, rising=lambda row: True):
        out = []
        for s in range(len(n)):
            have = (n[s] > 0).cpu().numpy()
            if not have.any():
                out.append([0.0] * K)
                continue
            rate = (total[s][n[s] > 0] / n[s][n[s] > 0]).cpu().numpy()
            fit = isotonic_regression(rate, weights=n[s][n[s] > 0].cpu().numpy(),
                                      increasing=rising(s)).x
            full = np.interp(np.arange(K), np.flatnonzero(have), fit)  # empty bins: neighbours'
            out.append([round(float(v), 4) for v in np.clip(full, 0.0, 1.0)])
        return out

    def first(r):
        return r == 0

    return {"confidence_edges": CONFIDENCE_EDGES, "greedy": smooth(hit, count),
            "sampled": smooth(kept, count),
            "counts": [[round(float(v), 1) for v in row] for row in count],
            "greedy_by_rank": smooth(rank_hit, tried, first),
            "sampled_by_rank": smooth(rank_p, tried, first),
            "counts_by_rank": [round(float(v), 1) for v in tried[0]],
            "about": "how often drafts are kept, by the head's top probability (bins up to "
                     "confidence_edges): a chain's draft per step (greedy: argmax equals the "
                     "target's; sampled: 1 - TV at temperature 1); a tree's top-k candidate by "
                     "rank (greedy: it is the target's argmax; sampled: the target's probability "
                     "of it); weights/train_heads.py on held-out greedy continuations"}


def load_saved_eagle(layer, fc, path: Path):
    """Load the EAGLE head this script saved in `path` (F16 -> float32) into `layer` and `fc`, on
    their device -> its draft vocabulary (None without one)."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(path) / "model.safetensors"), device=str(fc.weight.device))
    fc.load_saved(saved["fc.weight"].float(), saved["fc.bias"].float())
    layer.load_state_dict({k[len("model.layers.0."):]: v.float()
                           for k, v in saved.items() if k.startswith("model.layers.0.")})
    return saved.get("draft_vocab")


def load_eagle_torch(path: Path, shape: dict, gains=(1.0, 1.0)):
    """(layer, fc, draft vocabulary) holding the EAGLE head this script saved in `path`."""
    layer, fc = build_layer(shape), gained_linear(2 * shape["hidden_size"],
                                                  shape["hidden_size"], gains)
    return layer, fc, load_saved_eagle(layer, fc, path)


def calibrate(path: Path, target, held, *, new_tokens: int, eos, pad: int, seed: int) -> None:
    """Add the measured `acceptance` of the EAGLE head in `path` to its config.json: the greedy
    rates on the held-out greedy continuations `held` [((ids, prompt length), features)], the
    sampled ones on continuations of the same prompts sampled at T = 1, made here."""
    import torch

    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    layer, fc, cut = load_eagle_torch(path, cfg)
    if cut is None:
        cut = torch.arange(target.config.vocab_size)
    cut = cut.to(target.device)
    t = time.time()
    prompts = [[int(v) for v in s[:L]] for (s, L), _ in held]
    sampled = generate(target, prompts, batch=16, new_tokens=new_tokens, eos=eos, pad=pad,
                       seed=seed, sampled_only=True)
    sampled_feats = features(target, [s for s, _ in sampled])
    print(f"sampled continuations of the {len(prompts)} held-out prompts: "
          f"{sum(len(s) - L for s, L in sampled)} tokens, {time.time() - t:.0f} s", flush=True)
    tables = {}
    for kind, seqs, feats in (("greedy", [s for (s, _), _ in held], [f for _, f in held]),
                              ("sampled", [s for s, _ in sampled], sampled_feats)):
        starts = [L for (_, L), _ in held] if kind == "greedy" else [L for _, L in sampled]
        tables[kind] = acceptance(layer, fc, target.model.embed_tokens, target.model.norm,
                                  target.lm_head.weight, cut.long(),
                                  [np.asarray(s) for s in seqs], feats, starts,
                                  sampled_text=kind == "sampled")
    g, s_ = tables["greedy"], tables["sampled"]
    table = {"confidence_edges": g["confidence_edges"], "greedy": g["greedy"],
             "sampled": s_["sampled"], "greedy_by_rank": g["greedy_by_rank"],
             "sampled_by_rank": s_["sampled_by_rank"], "counts": g["counts"],
             "sampled_counts": s_["counts"],
             "about": "how often drafts are kept, by the head's top probability (bins up to "
                      "confidence_edges): a chain's draft per step (greedy: argmax equals the "
                      "target's, on held-out greedy continuations; sampled: 1 - TV, on "
                      "continuations of the same prompts sampled at T = 1, each start weighted "
                      "by the chance a sampled chain reached it); a tree's top-k candidate by "
                      "rank (greedy: it is the target's argmax; sampled: the target's "
                      "probability of it); weights/train_heads.py --calibrate-eagle"}
    cfg["acceptance"] = table
    cfg_file.write_text(config_text(cfg))
    n = sum(table["counts"][0])
    print(f"{cfg_file}: acceptance by confidence from {len(held)} held-out continuations "
          f"({n:.0f} chain starts) and as many sampled ones", flush=True)
    print(f"  confidence up to {' '.join(f'{v:4.2f}' for v in table['confidence_edges'])}")
    for kind in ("greedy", "sampled"):
        for s, row in enumerate(table[kind]):
            print(f"  {kind:7s} step {s + 1}:  {' '.join(f'{v:4.2f}' for v in row)}")
        for r, row in enumerate(table[f"{kind}_by_rank"]):
            print(f"  {kind:7s} rank {r + 1}:  {' '.join(f'{v:4.2f}' for v in row)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(HERE / "target"), help="a Hugging Face Llama dir")
    ap.add_argument("--out-eagle", default=None, help="where the EAGLE head goes (none: skip)")
    ap.add_argument("--out-medusa", default=None, help="where the Medusa heads go (none: skip)")
    ap.add_argument("--data", choices=("code", "chat", "mix"), default="code",
                    help="prompts: stdlib code prefixes, or ChatML requests + code")
    ap.add_argument("--seqs", type=int, default=1024, help="training continuations")
    ap.add_argument("--new-tokens", type=int, default=160, help="most new tokens per sequence")
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--eval-seqs", type=int, default=48, help="held-out greedy continuations")
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="FR-Spec: the heads propose only the N most frequent tokens (0: all)")
    ap.add_argument("--ttt", type=int, default=3, help="EAGLE steps unrolled in training")
    ap.add_argument("--eagle-epochs", type=float, default=6,
                    help="0: only measure the --init-eagle head on the held-out set (nothing "
                         "saved)")
    ap.add_argument("--medusa-epochs", type=float, default=8,
                    help="0: only measure the --init-medusa heads (nothing saved)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per training step")
    ap.add_argument("--eagle-lr", type=float, default=1e-3)
    ap.add_argument("--medusa-lr", type=float, default=2e-3)
    ap.add_argument("--reg", type=float, default=0.1, help="weight of EAGLE's feature loss")
    ap.add_argument("--fc-gains", default="1,1",
                    help="EAGLE's fc inputs multiplied by these in training (feature, token), "
                         "folded into fc.weight when saved: a learning rate per half, since a "
                         "token embedding is hundreds of times smaller than a feature")
    ap.add_argument("--noise", type=float, default=0.02,
                    help="uniform noise on EAGLE's input features (fraction of their std)")
    ap.add_argument("--ce", type=float, default=0.0,
                    help="weight of a cross-entropy on the target's argmax token (greedy drafts)")
    ap.add_argument("--init-eagle", default=None,
                    help="start EAGLE from this head (a directory this script wrote)")
    ap.add_argument("--init-medusa", default=None,
                    help="start Medusa from these heads (a directory this script wrote)")
    ap.add_argument("--heads", type=int, default=4, help="Medusa heads")
    ap.add_argument("--data-cache", default=None,
                    help="a .pt file: reuse the sequences and features saved there, else save "
                         "them; several, comma-separated: train on all of them (each made before)")
    ap.add_argument("--calibrate-eagle", default=None, metavar="DIR",
                    help="train nothing: measure the EAGLE head in DIR's acceptance by "
                         "confidence on the held-out sets of --data-cache and write it into "
                         "DIR/config.json (what its stop rule reads)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu",
                    help="torch device for everything (cuda: float32 matmuls in TF32)")
    ap.add_argument("--gen-seconds", type=float, default=None,
                    help="--data chat/mix: start no generation batch after this many seconds "
                         "(chat's batches go shortest prompts first)")
    ap.add_argument("--max-prompt-tokens", type=int, default=0,
                    help="--data chat/mix: drop longer prompts (0: keep all)")
    ap.add_argument("--feature-batch", type=int, default=8,
                    help="sequences per forward pass when computing features")
    ap.add_argument("--eagle-seconds", type=float, default=None,
                    help="cut EAGLE's schedule to what fits in this many seconds (timed on "
                         "its first steps)")
    ap.add_argument("--medusa-seconds", type=float, default=None,
                    help="the same for the Medusa heads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a ~1 minute smoke run")
    args = ap.parse_args(argv)
    try:
        gains = [float(v) for v in args.fc_gains.split(",")]
    except ValueError:
        gains = []
    if len(gains) != 2 or not all(0 < g < float("inf") for g in gains):
        raise SystemExit(f"--fc-gains: expected two positive numbers (feature,token), got "
                         f"{args.fc_gains!r}")
    for name, epochs, init in (("eagle", args.eagle_epochs, args.init_eagle),
                               ("medusa", args.medusa_epochs, args.init_medusa)):
        if epochs < 0 or (epochs == 0 and not init):
            raise SystemExit(f"--{name}-epochs: expected a positive number, or 0 with "
                             f"--init-{name} (measure that head only), got {epochs}")
    measure_eagle = args.eagle_epochs == 0  # the --init heads measured, nothing trained
    measure_medusa = args.medusa_epochs == 0
    if args.quick:
        args.seqs, args.new_tokens, args.eval_seqs = 32, 24, 8
        args.eagle_epochs = min(args.eagle_epochs, 1)  # 0 (measure only) stays 0
        args.medusa_epochs = min(args.medusa_epochs, 1)

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    import train as recipe  # the toy pair's recipe: corpus, on-policy generator, schedule

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    times = {}
    t_start = t = time.time()
    target = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # ~1e-3 relative, far under the heads' error
        torch.backends.cudnn.allow_tf32 = True
    target.to(dev)
    torch.set_default_device(dev)  # every tensor made below lives beside the target
    for prm in target.parameters():
        prm.requires_grad_(False)
    tc = target.config
    tok = Tokenizer.from_file(str(Path(args.target) / "tokenizer.json"))
    train_files, heldout_files, _ = recipe.read_corpus(args.quick)
    eos = sorted({i for i in (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>"),
                              tc.eos_token_id if isinstance(tc.eos_token_id, int) else None)
                  if i is not None})
    # how the held-out continuations were generated: chat stops at EOS, code runs on
    gen_eos, gen_pad = (eos, eos[-1]) if args.data == "chat" else ((), 0)

    # -- 1. data -----------------------------------------------------------------------------
    caches = [Path(c) for c in args.data_cache.split(",")] if args.data_cache else []
    cache = caches[0] if len(caches) == 1 else None  # where a new data set is saved
    if args.calibrate_eagle and not (caches and all(c.is_file() for c in caches)):
        raise SystemExit("--calibrate-eagle: needs --data-cache files made before (it measures "
                         "on their held-out sets)")
    if caches and all(c.is_file() for c in caches):  # several: joined, the first's eval set
        parts = [torch.load(c, weights_only=False, map_location=dev) for c in caches]
        data = {k: sum((d[k] for d in parts), []) for k in ("train", "feats")}
        data.update(eval=parts[0]["eval"], eval_feats=parts[0]["eval_feats"])
        held_all = [(e, h) for d in parts for e, h in zip(d["eval"], d["eval_feats"])]
        print(f"data: {len(data['train'])} + {len(data['eval'])} sequences from "
              f"{args.data_cache}")
    elif len(caches) > 1:
        raise SystemExit(f"--data-cache: {', '.join(str(c) for c in caches if not c.is_file())}"
                         " missing (only a single file is made)")
    else:
        if args.data == "code":  # train.py's generator: fixed-length batches, BOS + prefix
            made = recipe.onpolicy_sequences(target, tok, train_files, n=args.seqs,
                                             batch=args.gen_batch,
                                             new_tokens=(min(64, args.new_tokens), args.new_tokens),
                                             prefix=(24, 96), seed=args.seed)
            train = [(row.numpy(), L) for seq, L, _ in made for row in seq]
            by_len = recipe.onpolicy_prefixes(tok, heldout_files, 24, 96, rng)
            pool = [p for v in by_len.values() for p in v]
            held = [pool[i] for i in rng.permutation(len(pool))[: args.eval_seqs]]
            held = [p[1:] if p[:2] == [0, 0] else p for p in held]  # one BOS (below)
            evals = generate(target, held, batch=args.gen_batch, new_tokens=args.new_tokens,
                             eos=(), pad=0, seed=args.seed, greedy_only=True)
        else:
            flags = None
            if args.data == "mix":
                prompts, flags, held = mix_prompts(train_files, heldout_files, args.seqs,
                                                   args.eval_seqs, rng)
            else:
                prompts, held = chat_prompts(train_files, heldout_files, args.seqs,
                                             args.eval_seqs, rng)
            enc = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
            if args.max_prompt_tokens:
                keep = [j for j, e in enumerate(enc) if len(e) <= args.max_prompt_tokens]
                enc = [enc[j] for j in keep]
                flags = [flags[j] for j in keep] if flags is not None else None
            pad = eos[-1]
            train = generate(target, enc, batch=args.gen_batch, new_tokens=args.new_tokens,
                             eos=eos, pad=pad, seed=args.seed, sampled=flags,
                             seconds=args.gen_seconds)
            evals = generate(target, [tok.encode(p, add_special_tokens=False).ids
                                      for p in held],
                             batch=args.gen_batch, new_tokens=args.new_tokens, eos=eos,
                             pad=pad, seed=args.seed + 1, greedy_only=True)
        # train.py's prefixes are [EOT] + ids and its tokenizer adds EOT too: keep one BOS
        fix = [(s[1:], L - 1) if len(s) > 1 and s[0] == s[1] == 0 else (s, L) for s, L in
               train + evals]
        data = {"train": fix[: len(train)], "eval": fix[len(train):]}
        if cache is not None:
            torch.save(data, cache)
    train, evals = data["train"], data["eval"]
    n_new = sum(len(s) - L for s, L in train)
    times["data_s"] = round(time.time() - t)
    print(f"data: {len(train)} training sequences ({sum(len(s) for s, _ in train)} tokens, "
          f"{n_new} generated), {len(evals)} held-out greedy ones, {times['data_s']} s",
          flush=True)

    # -- 2. features ---------------------------------------------------------------------------
    t = time.time()
    seqs = [s for s, _ in train]
    eval_seqs = [s for s, _ in evals]
    if "feats" not in data:
        data["feats"] = features(target, seqs, args.feature_batch)
        data["eval_feats"] = features(target, eval_seqs, args.feature_batch)
        if cache is not None:
            torch.save(data, cache)
    feats, eval_feats = data["feats"], data["eval_feats"]
    times["features_s"] = round(time.time() - t)
    print(f"features: {times['features_s']} s", flush=True)
    if args.calibrate_eagle:
        held = held_all if len(caches) > 1 else list(zip(evals, eval_feats))
        calibrate(Path(args.calibrate_eagle), target, held, new_tokens=args.new_tokens,
                  eos=gen_eos, pad=gen_pad, seed=args.seed)
        return

    # -- 3. draft vocabulary -------------------------------------------------------------------
    V = tc.vocab_size
    gen_tokens = np.concatenate([s[L:] for s, L in train])
    held_tokens = np.concatenate([s[L:] for s, L in evals])
    if args.draft_vocab and args.draft_vocab < V:
        # frequency in the continuations; ties (often: unseen tokens) broken by the prompts'
        counts = np.bincount(gen_tokens, minlength=V) * (1 << 20) + np.bincount(
            np.concatenate([s[:L] for s, L in train]), minlength=V)
        counts[eos] = counts.max() + 1  # EOS always proposable
        cut = np.sort(np.argsort(-counts, kind="stable")[: args.draft_vocab]).astype(np.int64)
    else:
        cut = np.arange(V, dtype=np.int64)
    coverage = float(np.isin(held_tokens, cut).mean())
    print(f"draft vocabulary {len(cut)} of {V}: covers {coverage:.4f} of the held-out greedy "
          f"tokens ({len(held_tokens)})", flush=True)
    cut_t = torch.from_numpy(cut).to(dev)
    W_cut = target.lm_head.weight[cut_t].detach().clone()  # [N, D]
    norm = target.model.norm

    def logits(h):  # the target's final norm + (cut) LM head
        return norm(h) @ W_cut.T

    def teacher(f):  # the target's distribution restricted to the cut, renormalised
        with torch.no_grad():
            return F.log_softmax(logits(f), dim=-1)

    def kl(p_log, logq, mask):
        return ((p_log.exp() * (p_log - logq)).sum(-1) * mask).sum() / mask.sum().clamp(min=1)

    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    chunks = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]

    def schedule(epochs):  # length-bucketed batches, shuffled every epoch
        if epochs == 0:  # measure only
            return []
        steps = max(1, round(epochs * len(chunks)))
        return [chunks[j] for e in range(steps // len(chunks) + 1)
                for j in rng.permutation(len(chunks))][:steps]

    rope_theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta") or \
        getattr(tc, "rope_theta", None) or 10000.0
    target_id = {"model_type": tc.model_type, "hidden_size": tc.hidden_size,
                 "num_hidden_layers": tc.num_hidden_layers, "vocab_size": V}
    cut_fields = {"draft_vocab_size": len(cut)} if len(cut) < V else {}
    cut_tensor = {"draft_vocab": cut_t.cpu().clone()} if len(cut) < V else {}
    D = tc.hidden_size
    report = {"target": args.target, "data": args.data, "train_seqs": len(train),
              "generated_tokens": int(n_new), "eval_seqs": len(evals),
              "draft_vocab": len(cut), "coverage": round(coverage, 4), "threads": args.threads,
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}

    def within(plan, full, step, t0, seconds, marks):
        """The plan (a prefix of `full`) cut to the steps that fit in `seconds`: at step 8 at the
        pace so far, and again at step 64 at the pace since step 8 (the first steps hold the
        warm-up: on a GPU they made the cut at step 8 use 45-75% of the time given)."""
        if seconds is None or step not in (8, 64):
            return plan
        if dev.type == "cuda":
            torch.cuda.synchronize()
        now = time.time()
        marks[step] = now
        pace = (now - t0) / step if step == 8 else (now - marks[8]) / (step - 8)
        steps = min(len(full), max(step + 1, step + int((seconds - (now - t0)) / pace)))
        if steps != len(plan):
            print(f"{len(full)} steps planned, {steps} fit in {seconds:.0f} s "
                  f"({pace:.3f} s a step{', since step 8' if step == 64 else ''})", flush=True)
        return full[:steps]

    def chain_accept(match):
        """match [S, B, T']: step s's argmax at chain start c right -> mean accepted length."""
        run = torch.cumprod(match.float(), dim=0)
        return run.sum(0)

    # the held-out set mixes chat requests and raw code, which heads draft very differently:
    # the figures are given for each kind too (a chat sequence starts with <|im_start|>)
    im_start = tok.token_to_id("<|im_start|>")
    kinds = ["chat" if im_start is not None and s[0] == im_start else "code" for s in eval_seqs]

    def tally(totals, idx, accepted, ok):
        """Add a batch's accepted lengths [B, T'] at its valid chain starts ok [B, T'] to
        totals {kind: [accepted, rounds]} (rows idx of the held-out set), "all" included."""
        for r, i in enumerate(idx):
            for k in ("all", kinds[i]):
                totals.setdefault(k, [0.0, 0.0])
                totals[k][0] += (accepted[r] * ok[r]).sum().item()
                totals[k][1] += ok[r].sum().item()

    def per_kind(totals):
        """{kind: accepted per round} and its text for the log."""
        rates = {k: round(a / max(n, 1), 4) for k, (a, n) in totals.items()}
        text = ", ".join(f"{k} {rates[k]:.3f} ({totals[k][1]:.0f} rounds)"
                         for k in ("chat", "code") if k in totals)
        return rates, text

    def eagle_chain(layer, fc, embed):
        """The greedy chain of 4's accepted drafts on the held-out greedy continuations."""
        totals = {"all": [0.0, 0.0]}
        with torch.no_grad():
            for lo in range(0, len(eval_seqs), 8):
                idx = list(range(lo, min(lo + 8, len(eval_seqs))))
                x, f, lens = padded(eval_seqs, eval_feats, idx)
                T = x.shape[1]
                outs = eagle_unroll(layer, fc, embed, f, x, 4)
                # step s at position c + s guesses x_{c+s+2}, c = chain start (context n = c+2)
                C = T - 5
                match = torch.stack([cut_t[logits(g[:, s:s + C]).argmax(-1)] == x[:, s + 2:s + 2
                                                                                  + C]
                                     for s, g in enumerate(outs)])
                start = torch.tensor([L for _, L in (evals[i] for i in idx)])
                c = torch.arange(C)[None]
                ok = ((c + 2 >= start[:, None]) & (c + 5 < lens[:, None])).float()
                tally(totals, idx, chain_accept(match), ok)
        return totals

    # -- 4. EAGLE ------------------------------------------------------------------------------
    if args.out_eagle or measure_eagle:
        t = time.time()
        shape = {"hidden_size": D, "num_attention_heads": tc.num_attention_heads,
                 "num_key_value_heads": tc.num_key_value_heads,
                 "head_dim": getattr(tc, "head_dim", None) or D // tc.num_attention_heads,
                 "intermediate_size": tc.intermediate_size, "rms_norm_eps": tc.rms_norm_eps,
                 "rope_theta": float(rope_theta)}
        layer = build_layer(shape)
        fc = gained_linear(2 * D, D, gains)
        if args.init_eagle:  # continue a run: the weights this script saved (F16)
            load_saved_eagle(layer, fc, args.init_eagle)
        embed = target.model.embed_tokens
        if args.init_eagle and not measure_eagle:  # where it starts, on this held-out set
            rates, text = per_kind(eagle_chain(layer, fc, embed))
            report["eagle_chain_accepted_before"] = rates["all"]
            print(f"eagle before training ({args.init_eagle}): greedy chain of 4 on held-out "
                  f"continuations: {rates['all']:.3f} accepted per round; {text}", flush=True)
        params = list(layer.parameters()) + list(fc.parameters())
        opt = torch.optim.AdamW(params, lr=args.eagle_lr, weight_decay=0.0, betas=(0.9, 0.95))
        plan = full = schedule(args.eagle_epochs)
        marks = {}  # when steps 8 and 64 ended (within)
        for step, idx in enumerate(plan):
            plan = within(plan, full, step, t, args.eagle_seconds, marks)
            if step == len(plan):
                break
            lr = recipe.lr_at(step, len(plan), args.eagle_lr, max(1, len(plan) // 20))
            for g in opt.param_groups:
                g["lr"] = lr
            x, f, lens = padded(seqs, feats, idx)
            T = x.shape[1]
            valid = (torch.arange(T - 1)[None] + 1 < lens[:, None]).float()  # f_{i+1} real
            p_log = teacher(f[:, 1:])
            outs = eagle_unroll(layer, fc, embed, f, x, args.ttt, args.noise)
            loss, kls = 0.0, []
            for s, g in enumerate(outs):
                m = valid * (torch.arange(T - 1)[None] >= s).float()
                logq = F.log_softmax(logits(g), dim=-1)
                k_s = kl(p_log, logq, m)
                if args.ce:  # the target's argmax: what a greedy draft must say
                    top = logq.gather(-1, p_log.argmax(-1, keepdim=True))[..., 0]
                    loss = loss - args.ce * (top * m).sum() / m.sum().clamp(min=1)
                reg = (F.smooth_l1_loss(g, f[:, 1:], reduction="none").mean(-1) * m).sum() \
                    / m.sum().clamp(min=1)
                loss = loss + k_s + args.reg * reg
                kls.append(k_s.item())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if step % 25 == 0 or step == len(plan) - 1:
                print(f"eagle step {step:4d}/{len(plan)}  kl per step "
                      f"{' '.join(f'{v:.3f}' for v in kls)}  reg {reg.item():.3f}  "
                      f"lr {lr:.2e}  {time.time() - t:.0f} s", flush=True)
        times["eagle_s"] = round(time.time() - t)
        totals = eagle_chain(layer, fc, embed)
        rates, text = per_kind(totals)
        acc, n = rates["all"], totals["all"][1]
        report["eagle_chain_accepted"] = acc
        report["eagle_chain_accepted_by_kind"] = {k: v for k, v in rates.items() if k != "all"}
        print(f"eagle: greedy chain of 4 on held-out continuations: {acc:.3f} accepted per "
              f"round ({n:.0f} rounds), ~{1 + acc:.2f} tokens per target call; {text}; "
              f"{times['eagle_s']} s of training", flush=True)
    if args.out_eagle and not measure_eagle:
        out = Path(args.out_eagle)
        save_eagle(out, layer, fc, shape, {"target": target_id, **cut_fields,
                   "about": "EAGLE head (fc over (feature, next token) + one Llama decoder "
                            f"layer), trained with a {args.ttt}-step training-time test; "
                            "weights/train_heads.py",
                   "training": {**report, "init": args.init_eagle, "ce": args.ce,
                                "ttt": args.ttt, "epochs": args.eagle_epochs,
                                "steps": len(plan), "batch": args.batch, "lr": args.eagle_lr,
                                "reg": args.reg, "noise": args.noise, "seed": args.seed,
                                "fc_gains": gains, **times}}, cut_tensor)
        print(f"wrote {out}", flush=True)
        calibrate(out, target, list(zip(evals, eval_feats)), new_tokens=args.new_tokens,
                  eos=gen_eos, pad=gen_pad, seed=args.seed)

    # -- 5. Medusa -----------------------------------------------------------------------------
    if args.out_medusa or measure_medusa:
        t = time.time()
        K = args.heads
        W = torch.nn.Parameter(torch.zeros(K, D, D))  # [K, out, in]
        b = torch.nn.Parameter(torch.zeros(K, D))
        if args.init_medusa:  # continue a run: the heads this script saved (F16)
            from safetensors.torch import load_file
            st = load_file(str(Path(args.init_medusa) / "model.safetensors"), device=str(dev))
            if (f"medusa_head.{K - 1}.weight" not in st
                    or st["medusa_head.0.weight"].shape != W[0].shape):
                raise SystemExit(f"--init-medusa {args.init_medusa}: expected {K} heads of "
                                 f"[{D}, {D}] (--heads, this target's width)")
            with torch.no_grad():
                for k in range(K):
                    W[k] = st[f"medusa_head.{k}.weight"].float()
                    b[k] = st[f"medusa_head.{k}.bias"].float()
        opt = torch.optim.AdamW([W, b], lr=args.medusa_lr, weight_decay=0.0, betas=(0.9, 0.95))

        def medusa(h, k):
            return h + F.silu(h @ W[k].T + b[k])

        plan = full = schedule(args.medusa_epochs)
        marks = {}
        for step, idx in enumerate(plan):
            plan = within(plan, full, step, t, args.medusa_seconds, marks)
            if step == len(plan):
                break
            lr = recipe.lr_at(step, len(plan), args.medusa_lr, max(1, len(plan) // 20))
            for g in opt.param_groups:
                g["lr"] = lr
            x, f, lens = padded(seqs, feats, idx)
            T = x.shape[1]
            p_all = teacher(f)
            loss, kls = 0.0, []
            for k in range(K):  # head k at t guesses x_{t+2+k}: the target's p at t+1+k
                m = (torch.arange(T - 1 - k)[None] + 1 + k < lens[:, None]).float()
                logq = F.log_softmax(logits(medusa(f[:, : T - 1 - k], k)), dim=-1)
                k_k = kl(p_all[:, 1 + k:], logq, m)
                loss = loss + 0.8 ** k * k_k
                kls.append(k_k.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 25 == 0 or step == len(plan) - 1:
                print(f"medusa step {step:4d}/{len(plan)}  kl per head "
                      f"{' '.join(f'{v:.3f}' for v in kls)}  lr {lr:.2e}  "
                      f"{time.time() - t:.0f} s", flush=True)
        times["medusa_s"] = round(time.time() - t)
        totals = {"all": [0.0, 0.0]}
        with torch.no_grad():
            for lo in range(0, len(eval_seqs), 8):
                idx = list(range(lo, min(lo + 8, len(eval_seqs))))
                x, f, lens = padded(eval_seqs, eval_feats, idx)
                C = x.shape[1] - 5  # h_c (context n = c + 2) guesses x_{c+2+k}
                match = torch.stack([cut_t[logits(medusa(f[:, :C], k)).argmax(-1)]
                                     == x[:, 2 + k:2 + k + C] for k in range(K)])
                start = torch.tensor([L for _, L in (evals[i] for i in idx)])
                c = torch.arange(C)[None]
                ok = ((c + 2 >= start[:, None]) & (c + 1 + K < lens[:, None])).float()
                tally(totals, idx, chain_accept(match), ok)
        rates, text = per_kind(totals)
        report["medusa_chain_accepted"] = rates["all"]
        report["medusa_chain_accepted_by_kind"] = {k: v for k, v in rates.items() if k != "all"}
        print(f"medusa: greedy chain of {K} on held-out continuations: {rates['all']:.3f} "
              f"accepted per round, ~{1 + rates['all']:.2f} tokens per target call; {text}; "
              f"{times['medusa_s']} s of training", flush=True)
    if args.out_medusa and not measure_medusa:
        out = Path(args.out_medusa)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for k in range(K):
            tensors[f"medusa_head.{k}.weight"] = W[k].detach().to(torch.float16).cpu()
            tensors[f"medusa_head.{k}.bias"] = b[k].detach().to(torch.float16).cpu()
        save_file({**tensors, **cut_tensor}, str(out / "model.safetensors"))
        config = {"medusa_num_heads": K, "hidden_size": D, "target": target_id, **cut_fields,
                  "about": "Medusa-1 heads: head k (0-based) guesses the token k + 2 positions "
                           "after the hidden state it reads; weights/train_heads.py",
                  "training": {**report, "init": args.init_medusa,
                               "epochs": args.medusa_epochs, "steps": len(plan),
                               "batch": args.batch, "lr": args.medusa_lr, "seed": args.seed,
                               **times}}
        (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        print(f"wrote {out}", flush=True)
    print(f"done in {time.time() - t_start:.0f} s: {json.dumps(times)}", flush=True)


if __name__ == "__main__":
    main()
