"""Measure the shipped pair with minispec itself: per-token cost, acceptance, speedup.

* cost: seconds per decode step (one token fed with a KV cache, at positions 64..127) of the target
  and of the draft (the best of 7 interleaved runs), and their ratio;
* acceptance rate and tokens per target call of speculative decoding (gamma 4 by default), on the
  held-out prompts of ``weights/prompts.json``, at each temperature;
* speedup: wall time of ``autoregressive_generate`` over ``speculative_generate`` for the same
  prompts and number of new tokens (greedy outputs are also checked to be identical).

Usage (from the repository root)::

    python weights/measure.py --prompts 50 --max-new-tokens 64 --temperatures 0,1
    python weights/measure.py --temperatures ''     # the cost ratio alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against this checkout

import minispec
from minispec.backend import set_blas_threads
from minispec.speculative import autoregressive_generate, speculative_generate


def step_costs(models, steps: int = 64, start: int = 64, repeats: int = 7) -> list[float]:
    """Seconds per single-token decode step with a KV cache, for each model: the minimum over
    `repeats` runs, the models interleaved so that a busy machine slows them alike."""
    best = [float("inf")] * len(models)
    for _ in range(repeats):
        for j, model in enumerate(models):
            n = min(steps, model.config.max_position_embeddings - start)
            cache = model.new_cache()
            model.forward([1] * start, cache)
            t0 = time.perf_counter()
            for i in range(n):
                model.forward([(7 * i) % 256 + 1], cache)
            best[j] = min(best[j], (time.perf_counter() - t0) / n)
    return best


def main(argv: list[str] | None = None) -> None:
    """Print a JSON report of cost ratio, acceptance and speedup."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default="weights")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=50, help="the first N prompts (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS threads, as minispec bench (default 1: see minispec/backend.py)")
    args = p.parse_args(argv)
    set_blas_threads(args.threads)

    w = Path(args.weights)
    target = minispec.load(w / "target", device="cpu")
    draft = minispec.load(w / "draft", device="cpu")
    prompts = json.loads((w / "prompts.json").read_text())["prompts"]
    prompts = prompts[:args.prompts] if args.prompts else prompts
    t_cost, d_cost = step_costs([target, draft])
    report = {"target_ms_per_token": round(t_cost * 1e3, 3),
              "draft_ms_per_token": round(d_cost * 1e3, 3),
              "cost_ratio": round(t_cost / d_cost, 2), "gamma": args.gamma,
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "results": {}}
    print(json.dumps(report), flush=True)
    for temperature in [float(t) for t in args.temperatures.split(",") if t]:
        ar_s = sp_s = 0.0
        drafted = accepted = calls = emitted = same = 0
        for i, pr in enumerate(prompts):
            ids = target.tokenizer.encode(pr["text"])
            kw = {"max_new_tokens": args.max_new_tokens, "temperature": temperature,
                  "seed": args.seed + i}
            t0 = time.perf_counter()
            ar = autoregressive_generate(target, ids, **kw)
            t1 = time.perf_counter()
            sp = speculative_generate(target, draft, ids, gamma=args.gamma, **kw)
            t2 = time.perf_counter()
            ar_s, sp_s = ar_s + t1 - t0, sp_s + t2 - t1
            st = sp.stats
            drafted, accepted, calls = drafted + st.drafted, accepted + st.accepted, \
                calls + st.target_calls
            emitted += len(sp.tokens)
            same += ar.tokens == sp.tokens
        r = {"acceptance_rate": round(accepted / drafted, 4),
             "tokens_per_target_call": round(emitted / calls, 3),
             "autoregressive_s": round(ar_s, 2), "speculative_s": round(sp_s, 2),
             "speedup": round(ar_s / sp_s, 3), "identical_outputs": f"{same}/{len(prompts)}"}
        report["results"][str(temperature)] = r
        print(json.dumps({str(temperature): r}), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
