"""Where a graphed decode step's time goes, on the GPU: a 1B Llama-shaped model in float16.

Times, for a call of k = 1 and 5 tokens on a warm 64-position cache, Model.forward with CUDA
graphs whose head (final norm, LM head) is plain CuPy and cuBLAS (head=False) against the head
captured as a graph too (head=True), the two taken in turn call by call (median of 40). Then,
with CUDA events (GPU time alone, median of 40): the layers' graph, the head's graph and the
plain head; and the host's time in forward() before the GPU is waited for.

    python .ci/gpu_step.py [DIR]      # DIR: the checkpoint (written if absent; /tmp/llama1b)
"""

import sys
import time
from pathlib import Path
from statistics import median

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minispec import cuda_graphs  # noqa: E402
from minispec.loader import load  # noqa: E402
from minispec.measure import harness, roofline  # noqa: E402

CONTEXT, REPS = 64, 40
path = roofline.write_random_llama(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama1b"))
model = load(path, device="gpu", dtype="float16")
floor = harness.memory_floor(model, harness.read_bandwidth(2 * 2**30, 10, cp))["floor_step_s"]
variants = {"head plain": cuda_graphs.StepGraphs(model, head=False),
            "head graphed": cuda_graphs.StepGraphs(model, head=True)}


def events_ms(fn, reps=REPS):
    a, b, out = cp.cuda.Event(), cp.cuda.Event(), []
    for i in range(reps + 3):
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 3:
            out.append(cp.cuda.get_elapsed_time(a, b))
    return median(out)


gb = harness.decode_weight_bytes(model) / 1e9
print(f"{roofline.gpu_name(cp)}; floor {floor * 1e3:.3f} ms a step ({gb:.2f} GB of weights)")
for k in (1, 5):
    ids = (np.arange(CONTEXT + k) % 256 + 3).tolist()
    runs = {}
    for name, g in variants.items():
        cuda_graphs.use(model, g)
        cache = model.new_cache(CONTEXT + k)
        model.forward(ids[:CONTEXT], cache)
        runs[name] = (g, cache, [], [])
    for i in range(REPS + 3):
        for name, (g, cache, wall, host) in runs.items():
            cuda_graphs.use(model, g)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            logits = model.forward(ids[CONTEXT:], cache)
            t1 = time.perf_counter()
            cp.cuda.Device().synchronize()
            t2 = time.perf_counter()
            if i >= 3:
                wall.append(t2 - t0)
                host.append(t1 - t0)
            cache.rollback(CONTEXT)
    ref = None
    for name, (g, cache, wall, host) in runs.items():
        cuda_graphs.use(model, g)
        logits = cp.asnumpy(model.forward(ids[CONTEXT:], cache))
        cache.rollback(CONTEXT)
        err = "" if ref is None else f", logits vs head plain {np.abs(logits - ref).max():.2e}"
        ref = logits if ref is None else ref
        print(f"k={k} {name:13s} forward {median(wall) * 1e3:6.3f} ms (host returns after "
              f"{median(host) * 1e3:6.3f} ms), {floor / median(wall):5.1%} of the floor{err}")
    # GPU time alone, by events
    g, cache = runs["head graphed"][0], runs["head graphed"][1]
    cuda_graphs.use(model, g)
    model.forward(ids[CONTEXT:], cache)
    cache.rollback(CONTEXT)
    layer_graph = next(v for (ck, t), v in g.graphs.items() if t == k and ck == id(cache.k))
    h = model.hidden_states(ids[CONTEXT:], cache)
    cache.rollback(CONTEXT)
    head_graph = g.heads[k]
    cuda_graphs.use(model, None)
    print(f"k={k} GPU time: layers' graph {events_ms(layer_graph.graph.launch):.3f} ms, head's "
          f"graph {events_ms(head_graph.graph.launch):.3f} ms, plain head "
          f"{events_ms(lambda: model.lm_head(h)):.3f} ms")
