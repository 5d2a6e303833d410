"""How far minispec's tensor-core product is from cuBLAS's GEMM as the rows grow: a batch's
call has B x k rows, and where its cost starts to grow is where speculation stops paying
(`minispec crossover --device gpu`). All the weight products of one step of a Llama-3.2-1B-shaped
model (.ci/gpu_rows.py's weights, 2.47 GB in float16) for t rows: minispec's kernel replayed as
one CUDA graph, against cupy.matmul (cuBLAS, which CuPy cannot capture: launched op by op, timed
by CUDA events around the whole sequence; at few rows its launches, not the GPU, may set that
time). Median of 10.

    python .ci/gpu_gemm.py        # run by .ci/gpu
"""

import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_rows import D, F, step_ms, weights  # noqa: E402

from minispec.cuda_graphs import FusedKernels  # noqa: E402

TS = (1, 5, 16, 20, 40, 80, 160, 320)


def cublas_ms(layers, head, t, reps=10):
    rs = cp.random.RandomState(t)
    x = rs.standard_normal((t, D), dtype=cp.float32).astype(cp.float16)
    xf = rs.standard_normal((t, F), dtype=cp.float32).astype(cp.float16)

    def step():
        for L in layers:
            x @ L["qkv"]
            x @ L["o"]
            x @ L["g"]
            x @ L["u"]
            xf @ L["d"]
        x @ head

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


def main():
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    layers, head = weights()
    flops = 2 * (sum(a.size for L in layers for a in L.values()) + head.size)
    k = FusedKernels(cp, "float16")
    print(f"{name}, float16: one step's weight products of a 1.2B Llama for t rows")
    print(f"{'t':>4} {'minispec ms':>12} {'TFLOP/s':>8} {'cuBLAS ms':>10} {'TFLOP/s':>8}")
    for t in TS:
        ours, theirs = step_ms(k, layers, head, t, reps=10), cublas_ms(layers, head, t)
        print(f"{t:>4} {ours:12.3f} {flops * t / ours / 1e9:8.1f} {theirs:10.3f} "
              f"{flops * t / theirs / 1e9:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
