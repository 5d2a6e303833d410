"""On a GPU machine: the shipped pair's greedy output on the GPU (plain and with CUDA graphs,
float32; and float16) against the CPU's, token for token; speculative greedy == autoregressive.

    python .ci/gpu_identity.py        # run by .ci/gpu
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minispec import cuda_graphs  # noqa: E402
from minispec.core.speculative import autoregressive_generate, speculative_generate  # noqa: E402
from minispec.drafters import make_drafter  # noqa: E402
from minispec.loader import load  # noqa: E402
from minispec.measure import harness  # noqa: E402
from minispec.shipped import shipped_dir  # noqa: E402

N = 64
d = shipped_dir()
cpu = load(d / "target", device="cpu")
prompts = harness.encode_prompts(harness.load_prompts(d / "prompts.json", 10), cpu.tokenizer)


def run(name, fn):
    t0 = time.perf_counter()
    out = [fn(p) for p in prompts]
    print(f"{name:34s} {time.perf_counter() - t0:6.2f} s", flush=True)
    return out


def ar(model):
    return lambda p: autoregressive_generate(model, p, max_new_tokens=N, temperature=0).tokens


def spec(target, draft, name):
    return lambda p: speculative_generate(
        target, make_drafter(name, target, draft_model=draft), p, gamma=4, max_new_tokens=N,
        temperature=0).tokens


ref = run("cpu float32 autoregressive", ar(cpu))
rows = {}
for dtype in ("float32", "float16"):
    gpu, gdraft = load(d / "target", device="gpu", dtype=dtype), load(d / "draft", device="gpu",
                                                                        dtype=dtype)
    rows[f"gpu {dtype} plain autoregressive"] = run(f"gpu {dtype} plain AR", ar(gpu))
    cuda_graphs.enable(gpu)
    cuda_graphs.enable(gdraft)
    rows[f"gpu {dtype} graphs autoregressive"] = g_ar = run(f"gpu {dtype} graphs AR", ar(gpu))
    for name in ("model", "ngram", "medusa", "eagle"):
        out = run(f"gpu {dtype} graphs spec {name}", spec(gpu, gdraft, name))
        same = sum(a == b for a, b in zip(out, g_ar))
        print(f"  speculative {name} == autoregressive on the same path: {same}/{len(out)}")
    print(f"  graph captures: target {gpu.fast_steps.captures}, draft "
          f"{gdraft.fast_steps.captures}")
for name, out in rows.items():
    same = sum(a == b for a, b in zip(out, ref))
    lead = [harness_lead for harness_lead in
            (next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
             for a, b in zip(out, ref))]
    print(f"{name:34s} identical to the CPU: {same}/{len(out)} (first difference at {lead})")
