"""On a GPU machine, float16: where greedy tree drafting (and early exit) leaves autoregressive
decoding on the shipped pair, and how near the tie is there.

Autoregressive decoding replays the graphed step (the tensor-core product); a tree's verify call
and early exit's take the plain path (cuBLAS), whose float16 rounding differs. For each prompt
where the greedy outputs differ, prints the first position that does, the two tokens, their
float32 logits on the CPU and their float16 logits on the GPU's plain path.

    python .ci/gpu_ties.py        # run by .ci/gpu
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minispec import cuda_graphs  # noqa: E402
from minispec.core.speculative import autoregressive_generate, speculative_generate  # noqa: E402
from minispec.drafters import make_drafter  # noqa: E402
from minispec.loader import load  # noqa: E402
from minispec.measure import harness  # noqa: E402
from minispec.shipped import shipped_dir  # noqa: E402

d = shipped_dir()
cpu = load(d / "target", device="cpu")
prompts = harness.encode_prompts(harness.load_prompts(d / "prompts.json", 4), cpu.tokenizer)
gpu = load(d / "target", device="gpu", dtype="float16")
draft = load(d / "draft", device="gpu", dtype="float16")
cuda_graphs.enable(gpu)
cuda_graphs.enable(draft)
for name, kw in [("model-tree", dict(draft_model=draft)), ("medusa", dict(tree=(2, 2, 1, 1))),
                 ("early-exit", {})]:
    for i, p in enumerate(prompts):
        ar = autoregressive_generate(gpu, p, max_new_tokens=32, temperature=0).tokens
        sp = speculative_generate(gpu, make_drafter(name, gpu, **kw), p, gamma=4,
                                  max_new_tokens=32, temperature=0).tokens
        if ar == sp:
            continue
        j = next(k for k in range(min(len(ar), len(sp))) if ar[k] != sp[k])
        ctx = p + ar[:j]
        lc = cpu.logits(ctx)[-1].astype(np.float64)
        top = np.sort(lc)[::-1]
        cuda_graphs.disable(gpu)
        lg = np.asarray(gpu.logits(ctx)[-1], dtype=np.float64)
        cuda_graphs.enable(gpu)
        print(f"{name}: prompt {i}: first difference at {j}: AR {ar[j]} spec {sp[j]}; float32 CPU "
              f"logits of the two {lc[ar[j]]:.4f} / {lc[sp[j]]:.4f} (top-2 gap "
              f"{top[0] - top[1]:.4f}); float16 plain GPU {lg[ar[j]]:.4f} / {lg[sp[j]]:.4f}",
              flush=True)
