"""Part G of the judge: a whole generation pipeline (`--generator module:factory`).

The bugs users of real systems hit are rarely in the ratio test; they are in the pipeline
around it. So the judge also takes a whole generator: factory(target_dir, draft_dir) ->
generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed) -> new token ids
(minispec/generators.py has minispec's own, minispec/hf_generators.py transformers'). It writes
a small random pair as Hugging Face directories, computes the exact law of the next L tokens
from the target alone, and compares the generator's output over many seeds with it. Its
controls: minispec's pipeline with one bug planted each, at the same sample size.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from ..core.sampling import Sampling, sample
from ..core.speculative import speculative_generate
from ..core.verify import verify as minispec_verify
from ..drafters import Draft, Drafter
from ..loader import load, save_checkpoint
from .selftest import made_by, tiny_models
from .stats import E2E, Fit, Row, exact_joint, joint_row, rng_for

PIPELINE_FULL = [  # (sampling and L, the draft, the prompt)
    (E2E(1.0, L=2, draft="near"), [1, 5, 9]),
    (E2E(1.0, top_k=3, L=3, draft="near"), [4, 2, 11, 7, 4, 2, 11]),  # repeats: prompt lookup
    (E2E(1.3, top_p=0.8, L=2, draft="far"), [3]),
    (E2E(0.8, top_k=3, L=4, draft="near"), [6, 1, 6, 1, 6]),
    (E2E(1.0, top_k=6, top_p=0.9, L=3, draft="far"), [2, 14, 9, 2, 14]),
    (E2E(1.5, top_k=2, L=3, draft="near"), [4, 2, 11, 7, 4, 2, 11]),
]


# where every planted bug shows, also with few calls (a hot temperature and top-k, a near draft:
# drafts often accepted, few outcomes): each was rejected below 1e-9 there with 200 calls
PIPELINE_CONTROL = PIPELINE_FULL[-1]
PIPELINE_QUICK = [PIPELINE_CONTROL]
PIPELINE_BUGS = {
    "greedy draft": "the draft picks its argmax but reports the sampling q (transformers #32867)",
    "q without top-k": "drafts drawn after top-k, q reported without it (transformers #47932)",
    "cache one short": "the target's cache loses its last position before each verify call",
    "uniforms reused": "verify's acceptance uniforms replay the ones that drew the drafts",
}
# Bugs that cost speed, not exactness, and so cannot be caught from the output alone: a dropped
# bonus token (the next round drafts from the right context), a draft cache never rolled back
# (its q is wrong but is the q its tokens were drawn from). Part 1 catches the first.


def write_pair(root: str) -> dict[str, str]:
    """The tiny target and its two drafts (tiny_models) as Hugging Face directories: config.json
    and model.safetensors in float32, no EOS (nothing may cut the L tokens short)."""
    dirs = {}
    for name, model in tiny_models().items():
        dirs[name] = os.path.join(root, name)
        save_checkpoint(model, dirs[name])
        with open(os.path.join(dirs[name], "generation_config.json"), "w") as f:
            f.write('{"do_sample": true, "top_k": 0}\n')
    return dirs


def call_generator(generate, prompt, cfg: E2E, n: int, seed: int, label: str
                   ) -> tuple[list[tuple[int, ...]], str]:
    """n outputs of generate, one seed each; (outputs, the first protocol violation or "")."""
    base = int(rng_for(seed, "pipeline", label, cfg.name).integers(2**31))
    out, t0 = [], time.perf_counter()
    for i in range(n):
        tokens = generate(list(prompt), max_new_tokens=cfg.L, temperature=cfg.temperature,
                          top_k=cfg.top_k, top_p=cfg.top_p, seed=base + i)
        tokens = tuple(int(t) for t in tokens)
        if len(tokens) != cfg.L:
            return out, f"call {i} returned {len(tokens)} tokens, expected {cfg.L}"
        out.append(tokens)
        if sys.stderr.isatty() and (i + 1) % 100 == 0:
            rate = (i + 1) / (time.perf_counter() - t0)
            print(f"\r{label}, {cfg.name}: {i + 1}/{n} calls, {rate:.0f}/s ", end="",
                  file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print("\r" + " " * 70 + "\r", end="", file=sys.stderr, flush=True)
    return out, ""


def broken_generator(bug: str):
    """minispec's speculative pipeline (the model drafter, gamma 3) with one planted bug."""
    class Broken(Drafter):
        """A model drafter written out with no cache (every draft a full recompute), with the
        bug planted where it lives in a real pipeline."""

        name = "broken"

        def __init__(self, target, model, sampling):
            super().__init__(target)
            self.model, self.sampling, self.states = model, sampling, []

        def propose(self, context, gamma, warp, rng):
            self.states = [rng.bit_generator.state]
            no_top_k = Sampling(self.sampling.temperature, 0, self.sampling.top_p)
            ctx, tokens, q = list(context), [], []
            for _ in range(gamma):
                z = self.model.logits(ctx)[-1]  # [V]
                row = warp(z)
                x = int(np.argmax(row)) if bug == "greedy draft" else sample(row, rng)
                q.append(no_top_k.warp(z) if bug == "q without top-k" else row)
                tokens.append(x)
                ctx.append(x)
            return Draft(np.array(tokens, dtype=np.int64),
                         np.array(q, dtype=np.float64).reshape(len(tokens), self.vocab_size))

        def target_forward(self, unseen, draft, cache):
            if bug != "cache one short" or cache.length == 0:
                return super().target_forward(unseen, draft, cache)
            cache.length -= 1  # the bug: the last position forgotten, the tokens fed one early
            out = super().target_forward(unseen, draft, cache)
            cache.length += 1
            return out

    def factory(target_dir, draft_dir):
        target, draft = load(target_dir, device="cpu"), load(draft_dir, device="cpu")

        def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
            drafter = Broken(target, draft, Sampling(temperature, top_k, top_p))

            def verify(p, q, draft_tokens, rng):
                if bug == "uniforms reused" and drafter.states:  # replay the drafts' uniforms
                    rng = np.random.Generator(np.random.PCG64())
                    rng.bit_generator.state = drafter.states.pop()
                return minispec_verify(p, q, draft_tokens, rng)

            return speculative_generate(target, drafter, prompt_ids, gamma=3,
                                        max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_k=top_k, top_p=top_p, seed=seed,
                                        verify=verify).tokens

        return generate

    return factory


def pipeline_label(cfg: E2E, prompt: list[int]) -> str:
    """A part-G configuration (the generator picks its own gamma: none is shown)."""
    return f"{cfg.name.replace(f' g={cfg.gamma}', '')}, {cfg.draft}, prompt of {len(prompt)}"


def part_pipeline(factory, label: str, quick: bool, n: int, seed: int,
                  with_controls: bool = True) -> tuple[list[Row], list[Row]]:
    """Part G: the generator made by `factory` on every configuration; the planted bugs (each
    a broken minispec pipeline) at the same sample size, as controls."""
    rows, controls = [], []
    with tempfile.TemporaryDirectory() as root:
        dirs = write_pair(root)
        target = load(dirs["target"], device="cpu")  # the law: from the files written
        made: dict[tuple, object] = {}  # keyed by the factory itself: it stays alive

        def generator(make, draft):
            if (make, draft) not in made:
                made[(make, draft)] = made_by(make, "--generator", label,
                                              "factory(target_dir, draft_dir)", dirs["target"],
                                              dirs[draft])
            return made[(make, draft)]

        for cfg, prompt in PIPELINE_QUICK if quick else PIPELINE_FULL:
            law = exact_joint(target, prompt, cfg)
            where = pipeline_label(cfg, prompt)
            samples, error = call_generator(generator(factory, cfg.draft), prompt, cfg, n, seed,
                                            label)
            row = joint_row("G", where, law, samples)
            if error:
                row.fit = Fit(row.fit.stat, row.fit.dof, 0.0, error)
            rows.append(row)
        if with_controls:
            cfg, prompt = PIPELINE_CONTROL
            law = exact_joint(target, prompt, cfg)
            for bug in PIPELINE_BUGS:
                samples, _ = call_generator(generator(broken_generator(bug), cfg.draft), prompt,
                                            cfg, n, seed, bug)
                controls.append(joint_row("G", pipeline_label(cfg, prompt), law, samples, bug))
    return rows, controls
