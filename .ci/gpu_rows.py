"""The GPU few-rows product on a 1B Llama's weight shapes: the time of a step's weight products
for each row count t, the multiply-add kernel (float32's, here run in float16) against the
tensor-core one at 8 and 16 warps a block (minispec uses cuda_graphs._MMA_WARPS), with the bit
checks the verify path relies on.

All the weight products of one step of a Llama-3.2-1B-shaped model (16 layers of qkv 3072x2048,
o 2048x2048, gate and up 8192x2048 as one SwiGLU kernel, down 2048x8192, then the 128256x2048
head; 2.47 GB in float16, random weights) are captured as one CUDA graph and replayed; the
median of 20 replays is printed, with the read rate it implies.

    python .ci/gpu_rows.py        # run by .ci/gpu
"""

import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minispec import cuda_graphs  # noqa: E402
from minispec.cuda_graphs import FusedKernels  # noqa: E402

D, F, V, LAYERS, QKV = 2048, 8192, 128256, 16, 2048 + 2 * 512
TS = (1, 2, 3, 4, 5, 8, 9, 12, 16)


def weights():
    rs = cp.random.RandomState(0)

    def w(o, i):  # stored [out, in], handed over as the [in, out] view, as loader.py does
        return (rs.standard_normal((o, i), dtype=cp.float32) * 0.02).astype(cp.float16).T

    layers = [dict(qkv=w(QKV, D), o=w(D, D), g=w(F, D), u=w(F, D), d=w(D, F))
              for _ in range(LAYERS)]
    return layers, w(V, D)


def step_ms(k, layers, head, t, reps=20):
    rs = cp.random.RandomState(t)
    x = rs.standard_normal((t, D), dtype=cp.float32).astype(cp.float16)
    xf = rs.standard_normal((t, F), dtype=cp.float32).astype(cp.float16)

    def step():
        for L in layers:
            k.linear(x, L["qkv"])
            k.linear(x, L["o"], res=x)
            k._swiglu(x, L["g"], L["u"])
            k.linear(xf, L["d"], res=x)
        k.linear(x, head)

    pool, stream = cp.cuda.MemoryPool(), cp.cuda.Stream(non_blocking=True)
    graph, _ = cuda_graphs.record(cp, pool, stream, step)
    return cuda_graphs.replay_ms(cp, graph, stream, reps)


def bit_checks(k, layers):
    """Every row of a t-row call is the same bits as that row alone (linear with bias and
    residual, and SwiGLU); the relative error of a 16-row call against float32 cuBLAS."""
    L = layers[0]
    rs = cp.random.RandomState(99)
    x = rs.standard_normal((16, D), dtype=cp.float32).astype(cp.float16)
    res = rs.standard_normal((16, QKV), dtype=cp.float32).astype(cp.float16)
    bias = rs.standard_normal(QKV, dtype=cp.float32).astype(cp.float16)
    one = cp.concatenate([k.linear(x[r:r + 1], L["qkv"], bias, res[r:r + 1]) for r in range(16)])
    one_s = cp.concatenate([k._swiglu(x[r:r + 1], L["g"], L["u"]) for r in range(16)])
    ok = True
    for t in TS:
        ok &= bool((k.linear(x[:t], L["qkv"], bias, res[:t]) == one[:t]).all())
        ok &= bool((k._swiglu(x[:t], L["g"], L["u"]) == one_s[:t]).all())
    ref = x.astype(cp.float32) @ L["qkv"].astype(cp.float32)
    y = k.linear(x, L["qkv"]).astype(cp.float32)
    err = float(cp.linalg.norm(y - ref) / cp.linalg.norm(ref))
    return ok, err


def main():
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    layers, head = weights()
    nbytes = sum(a.nbytes for L in layers for a in L.values()) + head.nbytes
    fma, mma = FusedKernels(cp, "float16"), FusedKernels(cp, "float16")
    fma.mma = False
    alt = FusedKernels(cp, "float16")  # the tensor-core product with the other block size
    alt.mma_warps = 16 if cuda_graphs._MMA_WARPS == 8 else 8
    names = {f"mma_{k}<{n}>": f"mma_{k}<{n}, {alt.mma_warps}>"
             for k in ("matmul", "swiglu") for n in (1, 2)}
    mod = cp.RawModule(code=cuda_graphs._SOURCE, options=("-std=c++17",),
                       name_expressions=list(names.values()))
    alt._k.update({key: mod.get_function(n) for key, n in names.items()})
    kinds = (("FMA kernel", fma), (f"mma {mma.mma_warps} warps", mma),
             (f"mma {alt.mma_warps} warps", alt))
    ok_all = True
    for label, k in kinds:
        ok, err = bit_checks(k, layers)
        ok_all &= ok and err < 2e-3
        print(f"{label:14s}: rows of a call == rows alone, bit for bit: {'yes' if ok else 'NO'};"
              f" relative error of 16 rows vs float32 cuBLAS {err:.1e}", flush=True)
    print(f"\n{name}, float16, {nbytes / 1e9:.3f} GB of weights: one step's weight products, "
          f"median of 20 graph replays")
    print("  t" + "".join(f" | {label:>20s}" for label, _ in kinds))
    print("   " + " | ms     GB/s  x t(1)" * len(kinds))
    base, total = {}, {}
    for t in TS:
        line = f"{t:>3}"
        for label, k in kinds:
            ms = step_ms(k, layers, head, t)
            base.setdefault(label, ms)
            total[label] = total.get(label, 0.0) + ms
            line += f" | {ms:6.3f} {nbytes / ms / 1e6:5.0f} {ms / base[label]:6.2f}"
        print(line, flush=True)
    best = min((base[label] + total[label] / len(TS), k.mma_warps) for label, k in kinds[1:])
    print(f"best tensor-core block (t(1) + mean over t): {best[1]} warps")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
