"""Speculative sampling written out in one file, on top of minispec's forward pass alone.

Each round the small draft model proposes gamma tokens; the target scores them all in one forward
call; each draft x is kept with probability min(1, p(x) / q(x)), the first rejected one is
replaced by a draw from norm(max(0, p - q)), and when every draft is kept the target's last row
gives a bonus token. Leviathan et al. 2023, Algorithm 1 and Appendix A.1 (and Chen et al. 2023)
makes it lossless: the output is distributed exactly as the target's own samples.
p, q: the target's and the draft's probability rows [V] (V: the target's vocabulary).

    python speculative_sampling.py --prompt "def fib(n):" --temperature 0.8
    python -m minispec judge --generator speculative_sampling:factory --quick   # from this folder
"""

import argparse

import numpy as np

import minispec


def warp(z, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Logits [..., V] -> probabilities [..., V]: temperature, then top-k, then top-p, tokens tied
    with the last one kept are kept (minispec.warp's rule). Temperature 0: one-hot at the argmax."""
    z = np.array(z.get() if hasattr(z, "get") else z, np.float64)  # .get(): CuPy, on a GPU
    if temperature == 0:
        return (np.arange(z.shape[-1]) == z.argmax(-1)[..., None]).astype(np.float64)
    z = (z - z.max(-1, keepdims=True)) / temperature
    if 0 < top_k < z.shape[-1]:
        z[z < np.sort(z, -1)[..., -top_k, None]] = -np.inf  # below the k-th largest
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    if top_p < 1:  # the nucleus: tokens whose more probable ones hold less than top_p
        desc = -np.sort(-p, -1)
        n = (np.cumsum(desc, -1) - desc < top_p).sum(-1, keepdims=True)
        p[p < np.take_along_axis(desc, n - 1, -1)] = 0.0
        p /= p.sum(-1, keepdims=True)
    return p


def rounds(target, draft, prompt_ids, *, max_new_tokens, temperature, top_k=0, top_p=1.0,
           gamma=4, seed=None, eos_token_id=None):
    """Yield each round's new tokens (accepted drafts, then one correction or bonus token);
    each round is one target forward call."""
    rng, V, ctx, n = np.random.default_rng(seed), target.vocab_size, list(prompt_ids), 0
    size = min(len(ctx) + max_new_tokens + gamma, target.config.max_position_embeddings)
    cache_p, cache_q = target.new_cache(size), draft.new_cache(size)
    while n < max_new_tokens:
        g = min(gamma, max_new_tokens - n - 1)  # a round emits up to g + 1 tokens
        xs, q, feed = [], np.zeros((g, V)), ctx[cache_q.length:]  # feed: what the draft hasn't seen
        for i in range(g):  # 1. draft g tokens, one draft call each
            q_i = warp(draft.forward(feed, cache_q)[-1], temperature, top_k, top_p)
            q[i, : len(q_i)] = q_i  # a smaller draft vocabulary: q = 0 past its end
            feed = [int(rng.choice(V, p=q[i]))]
            xs += feed
        logits = target.forward(ctx[cache_p.length:] + xs, cache_p)  # 2. one target call
        p = warp(logits[-(g + 1):], temperature, top_k, top_p)  # [g+1, V]: row g is the bonus's
        out = []
        for i, x in enumerate(xs):  # 3. verify, left to right
            if rng.random() < min(1.0, p[i, x] / q[i, x]):
                out.append(x)
                continue
            r = np.maximum(p[i] - q[i], 0.0)  # rejected: resample from the residual
            out.append(int(rng.choice(V, p=r / r.sum() if r.sum() > 0 else p[i])))  # p == q
            break
        else:
            out.append(int(rng.choice(V, p=p[g])))  # every draft kept: the bonus token
        ctx += out
        n += len(out)
        # 4. KV rollback: keep the positions whose tokens are still the context's (all but the
        # last token, which the next round feeds); the draft never fed its last draft
        cache_p.length = len(ctx) - 1
        cache_q.length = min(cache_q.length, len(ctx) - 1)
        if eos_token_id in out:
            yield out[: out.index(eos_token_id) + 1]
            return
        yield out


def generate(target, draft, prompt_ids, *, max_new_tokens, temperature, top_k=0, top_p=1.0,
             gamma=4, seed=None, eos_token_id=None) -> list[int]:
    """The new tokens after prompt_ids, sampled from target (top_k 0 and top_p 1.0 are off)."""
    return [t for r in rounds(target, draft, prompt_ids, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p, gamma=gamma,
                              seed=seed, eos_token_id=eos_token_id) for t in r]


def factory(target_dir, draft_dir):
    """For the judge's --generator: two model directories -> generate(prompt_ids, **sampling)."""
    target, draft = minispec.load(target_dir), minispec.load(draft_dir)
    return lambda prompt_ids, **kw: generate(target, draft, prompt_ids, gamma=3, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", default="def fib(n):")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    target, draft = minispec.load("shipped:target"), minispec.load("shipped:draft")
    ids = target.tokenizer.encode(args.prompt)
    new = list(rounds(target, draft, ids, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, gamma=args.gamma, seed=args.seed,
                      eos_token_id=getattr(target.config, "eos_token_id", None)))
    tokens = [t for r in new for t in r]  # new: the tokens of each round, one target call each
    print(args.prompt + target.tokenizer.decode(tokens))
    print(f"{len(tokens)} tokens in {len(new)} target calls: "
          f"{len(tokens) / max(1, len(new)):.2f} tokens per target call")


if __name__ == "__main__":
    main()
