"""Acceptance of the shipped draft against the shipped target, measured with transformers.

An independent check of the pair that does not go through minispec: it runs speculative decoding
(Leviathan et al. 2023, Algorithm 1) with PyTorch in float32, without a KV cache (every call
recomputes the whole context, which is slow but obviously right), on the held-out prompts of
``weights/prompts.json``, and reports

* the acceptance rate: accepted draft tokens / drafted tokens,
* tokens per target call: emitted tokens / verification calls,

at temperature 0 (greedy: a draft token is accepted iff it is the target's argmax) and at
temperature 1 (a draft token x ~ q is accepted with probability min(1, p(x)/q(x)); on a rejection
the correction is drawn from norm(max(0, p - q))).

Usage (from the repository root)::

    python weights/evaluate.py --gamma 4 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def run(target, draft, prompt_ids: list[int], *, gamma: int, max_new: int, temperature: float,
        gen) -> tuple[int, int, int, int]:
    """One speculative generation; returns (drafted, accepted, target_calls, emitted)."""
    import torch

    def probs(model, ids: list[int], last: int) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -last:].double()  # [last, V]
        if temperature == 0:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
        return torch.softmax(logits / temperature, -1)

    ctx = list(prompt_ids)
    drafted = accepted = calls = emitted = 0
    while emitted < max_new:
        g = min(gamma, max_new - emitted - 1)
        d_tokens, q = [], []
        for _ in range(g):
            qi = probs(draft, ctx + d_tokens, 1)[0]
            d_tokens.append(int(torch.multinomial(qi, 1, generator=gen)))
            q.append(qi)
        p = probs(target, ctx + d_tokens, g + 1)  # [g+1, V]
        calls += 1
        drafted += g
        out = []
        for i, x in enumerate(d_tokens):
            if torch.rand((), generator=gen, dtype=torch.float64) < min(1.0, p[i, x] / q[i][x]):
                out.append(x)
                continue
            resid = torch.clamp(p[i] - q[i], min=0)
            out.append(int(torch.multinomial(resid / resid.sum(), 1, generator=gen)))
            break
        else:
            out.append(int(torch.multinomial(p[g], 1, generator=gen)))  # the bonus token
        accepted += len(out) - 1 if len(out) <= g else g
        ctx += out
        emitted += len(out)
    return drafted, accepted, calls, emitted


def main(argv: list[str] | None = None) -> None:
    """Measure acceptance at each temperature on the held-out prompts and print a JSON report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default="weights")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    torch.set_num_threads(2)
    w = Path(args.weights)
    target = LlamaForCausalLM.from_pretrained(w / "target", dtype=torch.float32).eval()
    draft = LlamaForCausalLM.from_pretrained(w / "draft", dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(w / "target" / "tokenizer.json"))
    prompts = json.loads((w / "prompts.json").read_text())["prompts"]
    if args.prompts:
        prompts = prompts[:args.prompts]
    report = {"gamma": args.gamma, "max_new_tokens": args.max_new_tokens,
              "prompts": len(prompts), "results": {}}
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        gen = torch.Generator().manual_seed(args.seed)
        totals = [0, 0, 0, 0]
        t0 = time.time()
        with torch.no_grad():
            for pr in prompts:
                ids = [0] + tok.encode(pr["text"], add_special_tokens=False).ids
                r = run(target, draft, ids, gamma=args.gamma, max_new=args.max_new_tokens,
                        temperature=temperature, gen=gen)
                totals = [a + b for a, b in zip(totals, r)]
        drafted, accepted, calls, emitted = totals
        report["results"][str(temperature)] = {
            "acceptance_rate": round(accepted / drafted, 4),
            "tokens_per_target_call": round(emitted / calls, 3),
            "drafted": drafted, "accepted": accepted, "target_calls": calls,
            "emitted": emitted, "seconds": round(time.time() - t0, 1)}
        print(json.dumps({str(temperature): report["results"][str(temperature)]}), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
