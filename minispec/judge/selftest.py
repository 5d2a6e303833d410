"""Parts 2 and 3 of the judge: minispec's own loop end to end, and a user's drafter in it.

Part 2: tiny random draft and target models; the exact law of the next L tokens, enumerated with
the target alone (Model.logits over every prefix, then warp), against the histogram of
speculative_generate(..., max_new_tokens=L) over many seeds: the model drafter (with controls:
a broken verify step, a drafter that samples from another q than it reports), the model-free
drafters, generate_batch (with a control: the batch's rows misaligned), the tree drafters and
EAGLE. Part 3: the shipped pair in weights/, with top-k small enough to enumerate.

`judge_drafter` runs a drafter of one's own the same way (`--drafter module:factory`):
factory(target, draft) -> a minispec.Drafter made for `target`, a random Llama over 16 tokens;
`draft` is a smaller random model over the same vocabulary, for a drafter that wants one. Its
chains or trees are judged through generate and generate_batch, at several temperatures, with
top-k and top-p, and greedily.
"""

from __future__ import annotations

import os

import numpy as np

from ..batch import batched_target_forward, generate_batch
from ..config import ModelConfig
from ..core.sampling import sample, warp
from ..core.speculative import speculative_generate
from ..core.verify import verify as minispec_verify
from ..drafters import (
    Draft,
    Drafter,
    ModelDrafter,
    TreeModelDrafter,
    make_drafter,
    random_eagle,
    random_medusa,
)
from ..errors import MinispecError
from ..loader import load, random_model
from ..tree import TreeDrafter
from .stats import E2E, MODELS_SEED, Row, exact_joint, joint_row, rng_for
from .verify_step import Sampler, broken_sampler


def unwarped_drafter(target, model, top_k: int = 0):
    """A broken drafter (a control): draws each draft token from the draft model's logits at
    temperature 1 but reports q warped with the run's temperature, as a loop that warps the
    distribution it reports but not the one it samples would. Full recompute, no cache."""
    class UnwarpedDrafter(Drafter):
        name = "model"

        def propose(self, context, gamma, warp_fn, rng):
            ctx = list(context)
            tokens, qs = [], []
            for _ in range(gamma):
                z = model.logits(ctx)[-1]
                x = sample(warp(z, 1.0, top_k), rng)  # the bug: the temperature is not applied
                tokens.append(x)
                qs.append(warp_fn(z))
                ctx.append(x)
            return Draft(np.array(tokens, dtype=np.int64),
                         np.array(qs, dtype=np.float64).reshape(gamma, self.vocab_size))

    return UnwarpedDrafter(target)


def sample_e2e(target, drafter, prompt: list[int], cfg: E2E, n: int, seed: int,
               label: str, verify: Sampler | None = None) -> list[tuple[int, ...]]:
    """n continuations of L tokens from speculative_generate, one seed each; `verify` replaces
    minispec's verify step (for the controls)."""
    base = int(rng_for(seed, "e2e", label, cfg.name, cfg.draft).integers(2**31))
    out = []
    for i in range(n):
        res = speculative_generate(target, drafter, prompt, gamma=cfg.gamma, max_new_tokens=cfg.L,
                                   temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                   seed=base + i, verify=verify or minispec_verify)
        out.append(tuple(res.tokens))
    return out


def tiny_models(seed: int = MODELS_SEED) -> dict:
    """A random target over a 16-token vocabulary and two drafts: "far", a smaller random model
    (p and q far apart: most drafts rejected, the residual does the work), and "near", the
    target's weights drawn at 0.6x the scale (total variation 0.2 to 0.6 from the target: many
    drafts accepted, bonus tokens common, and every control shows)."""
    big = ModelConfig(vocab_size=16, hidden_size=32, n_layers=2, n_heads=2, intermediate_size=64,
                      max_position_embeddings=64)
    small = ModelConfig(vocab_size=16, hidden_size=16, n_layers=1, n_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    return {
        "target": random_model(big, seed=seed, scale=0.5),  # std 0.5: peaked distributions
        "far": random_model(small, seed=seed + 1, scale=0.5),
        "near": random_model(big, seed=seed, scale=0.3),
    }


TINY_PROMPT = [1, 5, 9]
E2E_FULL = [
    E2E(1.0, gamma=2, L=3, draft="far"),
    E2E(1.0, gamma=3, L=3),
    E2E(0.6, gamma=4, L=3),
    E2E(1.5, gamma=3, L=2, draft="far"),
    E2E(1.5, gamma=2, L=3),
    E2E(1.0, top_k=4, gamma=1, L=4),  # L > gamma + 1: several rounds, cache rollbacks between them
    E2E(0.8, top_p=0.8, gamma=2, L=3, draft="far"),
    E2E(0.6, top_k=5, top_p=0.9, gamma=3, L=3),
]
E2E_QUICK = [E2E(0.5, top_k=6, gamma=3, L=3)]  # the three controls' power: checked on this one
E2E_GREEDY = E2E(0.0, gamma=3, L=4)  # one possible outcome: every sample must be the argmax path


def e2e_controls(cfg: E2E) -> list[str]:
    """The controls that can show in this configuration's output. A dropped bonus token is not
    among them: the next round then drafts from the right context, so the output stays exact
    (only slower); part 1's tokens/round test catches it."""
    bugs = ["residual=p", "accept q/p"]
    # "unwarped q" needs a temperature to leave out, the same support for the draws and the
    # reported q (not so with top-p) and a near draft: with the far one nearly every draft is
    # rejected, and the output is the residual whatever the drafts were drawn from.
    if cfg.temperature not in (0.0, 1.0) and cfg.top_p == 1.0 and cfg.draft == "near":
        bugs.append("unwarped q")
    return bugs


def part2(seed: int, quick: bool, n: int, with_controls: bool) -> tuple[list[Row], list[Row]]:
    models = tiny_models()
    target = models["target"]
    rows, controls = [], []
    configs = E2E_QUICK if quick else E2E_FULL
    for cfg in configs + [E2E_GREEDY]:
        draft = models[cfg.draft]
        law = exact_joint(target, TINY_PROMPT, cfg)
        m = 40 if cfg.temperature == 0 else n
        label = f"{cfg.name}, {cfg.draft}"
        rows.append(joint_row("2", label, law, sample_e2e(target, draft, TINY_PROMPT, cfg, m,
                                                          seed, "true")))
        if not with_controls or cfg.temperature == 0:
            continue
        for bug in e2e_controls(cfg):
            if bug == "unwarped q":
                samples = sample_e2e(target, unwarped_drafter(target, draft, cfg.top_k),
                                     TINY_PROMPT, cfg, n, seed, bug)
            else:
                samples = sample_e2e(target, draft, TINY_PROMPT, cfg, n, seed, bug,
                                     verify=broken_sampler(bug))
            controls.append(joint_row("2", label, law, samples, bug))
    return rows, controls


NGRAM_PROMPT = [1, 15, 8, 1, 15]  # "1 15" recurs: the n-gram drafter first drafts "8 1 15"
E2E_DRAFTERS = [E2E(1.0, gamma=2, L=3), E2E(0.6, top_k=6, gamma=3, L=3)]


def part2_drafters(seed: int, quick: bool, n: int) -> list[Row]:
    """The model-free drafters of minispec/drafters/ end to end on the tiny target: n-gram
    lookup (one-hot q) on a prompt with a repeat, and early exit (the target's first layer and
    head, sharing its KV cache)."""
    target = tiny_models()["target"]
    rows = []
    for name in ("ngram", "early-exit"):
        for cfg in E2E_DRAFTERS[-1:] if quick else E2E_DRAFTERS:
            law = exact_joint(target, NGRAM_PROMPT, cfg)
            samples = sample_e2e(target, make_drafter(name, target), NGRAM_PROMPT, cfg, n, seed,
                                 name)
            rows.append(joint_row("2", f"{cfg.name}, {name}", law, samples))
    return rows


# Batches (minispec/batch.py): the tiny target and its near draft, the prompt several times in
# one batch beside prompts of other lengths; every copy is an independent sample.
E2E_BATCH = E2E(0.5, top_k=6, gamma=3, L=3)
BATCH_COMPANY = [[2, 7], [4, 4, 4, 4, 11], [13]]
BATCH_BUGS = {"batch rows": "each sequence of a batch verified against the next one's logits "
              "(rows of the batched target call misaligned)"}


def misaligned_drafter(target, model):
    """A broken batch (a control): the model drafter whose batched verify call hands sequence b
    the hidden states of sequence b+1 wherever their shapes agree, as an off-by-one split would."""
    class Misaligned(ModelDrafter):
        def target_forward_batch(self, drafters, unseen_lists, drafts, caches):
            hs = batched_target_forward(self.target, unseen_lists, drafts, caches)
            shifted = hs[1:] + hs[:1]
            return [s if s.shape == h.shape else h for s, h in zip(shifted, hs)]

    return Misaligned(target, model)


def sample_batch(target, drafter, cfg: E2E, n: int, seed: int, label: str
                 ) -> list[tuple[int, ...]]:
    """n continuations of TINY_PROMPT from generate_batch, four copies of it per batch beside
    three other prompts (BATCH_COMPANY); every copy is an independent sample."""
    batch = [TINY_PROMPT] * 4 + BATCH_COMPANY
    base = int(rng_for(seed, "batch", label).integers(2**31))
    out = []
    for i in range(-(-n // 4)):
        res = generate_batch(target, drafter, batch, gamma=cfg.gamma, max_new_tokens=cfg.L,
                             temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                             seed=base + i)
        out += [tuple(r.tokens) for r in res[:4]]
    return out[:n]


def part2_batch(seed: int, quick: bool, n: int) -> tuple[list[Row], list[Row]]:
    """generate_batch end to end: the law of the prompt's next L tokens, sampled in batches of
    four copies and three other prompts (a true row and its control)."""
    models = tiny_models()
    target, draft, cfg = models["target"], models["near"], E2E_BATCH
    law = exact_joint(target, TINY_PROMPT, cfg)
    label = f"{cfg.name}, near, batch of 7"
    true = joint_row("2", label, law, sample_batch(target, draft, cfg, n, seed, "true"))
    control = joint_row("2", label, law, sample_batch(target, misaligned_drafter(target, draft),
                                                      cfg, n, seed, "rows"), "batch rows")
    return [true], [control]


# tree drafters and EAGLE end to end on the tiny target: the model-tree drafter over the near
# draft, Medusa heads and EAGLE heads (random: the tiny target has none trained; exactness does
# not depend on their quality), EAGLE as a chain, a static tree and EAGLE-2's dynamic tree
E2E_TREE = [E2E(1.0, gamma=3, L=3), E2E(0.6, top_k=6, gamma=3, L=3),
            E2E(1.2, top_p=0.9, gamma=2, L=3)]


def part2_trees(seed: int, quick: bool, n: int) -> list[Row]:
    models = tiny_models()
    target = models["target"]
    drafters = {"model-tree 2,2,1": TreeModelDrafter(target, models["near"], (2, 2, 1)),
                "medusa 3,2,1": random_medusa(target, 3, seed=1, scale=0.3, shape=(3, 2, 1)),
                "eagle chain": random_eagle(target, seed=1),
                "eagle 2,2,1": random_eagle(target, seed=1, shape=(2, 2, 1)),
                "eagle-2 3,2,2 beam 2, 6 nodes": random_eagle(target, seed=1, shape=(3, 2, 2),
                                                              dynamic=(2, 6))}
    rows = []
    for label, drafter in drafters.items():
        for cfg in E2E_TREE[1:2] if quick else E2E_TREE:
            law = exact_joint(target, TINY_PROMPT, cfg)
            samples = sample_e2e(target, drafter, TINY_PROMPT, cfg, n, seed, label)
            rows.append(joint_row("2", f"{cfg.name}, {label}", law, samples))
        greedy = E2E_GREEDY
        rows.append(joint_row("2", f"{greedy.name}, {label}", exact_joint(target, TINY_PROMPT,
                                                                          greedy),
                              sample_e2e(target, drafter, TINY_PROMPT, greedy, 40, seed, label)))
    return rows


SHIPPED = E2E(1.0, top_k=3, gamma=3, L=2)


def part3(seed: int, n: int, weights: str) -> tuple[list[Row], str]:
    """The shipped pair, if weights/target and weights/draft are there."""
    tdir, ddir = os.path.join(weights, "target"), os.path.join(weights, "draft")
    missing = [d for d in (tdir, ddir) if not os.path.exists(os.path.join(d, "config.json"))]
    if missing:
        return [], f"part 3 skipped: no model at {', '.join(missing)}"
    target = load(tdir, device="cpu")
    draft = load(ddir, device="cpu")
    prompt = target.tokenizer.encode("def main():\n    ", add_bos=True) if target.tokenizer else [0]
    law = exact_joint(target, prompt, SHIPPED)
    samples = sample_e2e(target, draft, prompt, SHIPPED, n, seed, "shipped")
    name = (lambda t: repr(target.tokenizer.decode([t]))) if target.tokenizer else str
    return [joint_row("3", f"shipped pair {SHIPPED.name}", law, samples, name=name)], ""


def made_by(factory, flag: str, label: str, signature: str, *args):
    """factory(*args), or MinispecError naming the flag where the call itself fails (a function
    of another signature, or one that raises): the judge's own error, not the user's traceback."""
    try:
        return factory(*args)
    except Exception as e:  # noqa: BLE001 - anyone's code: every failure is reported alike
        raise MinispecError(f"{flag} {label}: calling it as {signature} failed: "
                            f"{type(e).__name__}: {e}") from None


def judge_drafter(factory, label: str, quick: bool, n: int, seed: int
                  ) -> tuple[list[Row], list[Row]]:
    """A drafter of one's own end to end (see the module docstring for factory's signature):
    generate at the E2E_TREE settings and greedily, generate_batch at one setting; as controls,
    minispec's model drafter with a broken verify step at the same sample size (the tests'
    power at this budget)."""
    models = tiny_models()
    target = models["target"]
    drafter = made_by(factory, "--drafter", label, "factory(target, draft)", target,
                      models["near"])
    if not isinstance(drafter, Drafter):
        raise MinispecError(f"--drafter {label}: the factory returned "
                            f"{type(drafter).__name__}, not a minispec.Drafter made for the "
                            "target it was given")
    rows = []
    configs = E2E_TREE[1:2] if quick else E2E_TREE
    for cfg in configs + [E2E_GREEDY]:
        law = exact_joint(target, TINY_PROMPT, cfg)
        m = 40 if cfg.temperature == 0 else n
        rows.append(joint_row("D", f"{cfg.name}, {drafter.name}", law,
                              sample_e2e(target, drafter, TINY_PROMPT, cfg, m, seed, label)))
    cfg = configs[0]
    law = exact_joint(target, TINY_PROMPT, cfg)
    rows.append(joint_row("D", f"{cfg.name}, {drafter.name}, batch", law,
                          sample_batch(target, drafter, cfg, n, seed, label)))
    controls = [joint_row("D", f"{cfg.name}, model drafter", law,
                          sample_e2e(target, models["near"], TINY_PROMPT, cfg, n, seed, bug,
                                     verify=broken_sampler(bug)), bug)
                for bug in ("residual=p", "accept q/p")]
    return rows, controls


# --drafter with --model: a drafter on a model of one's choice (a trained head on the target it
# was trained for), where the law of the next L tokens is still enumerable: top-k 3, L 4 (40
# target calls), a prompt every model can continue
MODEL = E2E(1.5, top_k=3, gamma=3, L=4)
MODEL_PROMPT = "The capital of France is"


def judge_drafter_on_model(factory, label: str, n: int, seed: int, model_dir,
                           text: str = MODEL_PROMPT, activations: str = "float32"
                           ) -> tuple[list[Row], list[Row]]:
    """The drafter factory(target, None) on the model in model_dir, continuing `text`: its
    output at MODEL's setting and greedily against the exact law; as controls, at the same
    sample size, the same drafter and model with a broken verify step (a chain drafter) or with
    its trees verified against the wrong proposal (a tree drafter: WrongTreeProposal).
    activations: minispec.load's (int8: a GGUF conversion's model of int8 activations)."""
    target = load(model_dir, device="cpu", activations=activations)
    if activations == "int8":  # its one arithmetic: the CPU speed path (minispec.load says why)
        from ..cpu_steps import enable_where_supported

        enable_where_supported(target)
    drafter = made_by(factory, "--drafter", label, "factory(target, None)", target, None)
    if not isinstance(drafter, Drafter):
        raise MinispecError(f"--drafter {label}: the factory returned "
                            f"{type(drafter).__name__}, not a minispec.Drafter made for the "
                            "target it was given")
    tok = target.tokenizer
    if tok is None and text != MODEL_PROMPT:
        raise MinispecError(f"--prompt: {model_dir} has no tokenizer.json to encode "
                            f"{text!r:.40} with")
    prompt = tok.encode(text) if tok else [1, 2, 3]
    name = (lambda t: repr(tok.decode([t]))) if tok else str
    where = f"{drafter.name} on {os.path.basename(os.path.normpath(model_dir))}"
    rows = []
    for cfg, m in ((MODEL, n), (E2E_GREEDY, 20)):
        law = exact_joint(target, prompt, cfg)
        rows.append(joint_row("D", f"{cfg.name}, {where}", law,
                              sample_e2e(target, drafter, prompt, cfg, m, seed, label),
                              name=name))
    law = exact_joint(target, prompt, MODEL)
    spy = WrongTreeProposal(drafter, plant=False)  # one generation: does it draft trees?
    speculative_generate(target, spy, prompt, gamma=MODEL.gamma, max_new_tokens=MODEL.L,
                         temperature=MODEL.temperature, top_k=MODEL.top_k, seed=seed)
    if spy.trees:
        controls = [joint_row("D", f"{MODEL.name}, {where}", law,
                              sample_e2e(target, WrongTreeProposal(drafter), prompt, MODEL, n, seed,
                                         TREE_BUG), TREE_BUG, name=name)]
    else:
        controls = [joint_row("D", f"{MODEL.name}, {where}", law,
                              sample_e2e(target, drafter, prompt, MODEL, n, seed, bug,
                                         verify=broken_sampler(bug)), bug, name=name)
                    for bug in ("residual=p", "accept q/p")]
    return rows, controls


TREE_BUG = "wrong proposal"  # a tree drafter's control on a model (judge --model)
MODEL_TREE_BUGS = {TREE_BUG: "the tree verified against the wrong proposal: top-k candidates "
                             "declared draws from q, sampled ones each given its parent's q row"}


class WrongTreeProposal(TreeDrafter):
    """A drafter's trees verified against the wrong proposal, the control for a tree drafter on
    a model: top-k candidates declared draws from q (the judge's part-T bug "top-k as sampled"),
    sampled ones each given its parent's q row (an off-by-one gathering the rows). With
    plant=False it only records whether any round drafted a tree (`trees`). Chains pass
    through unchanged."""

    def __init__(self, inner: Drafter, plant: bool = True) -> None:
        super().__init__(inner.target)
        self.inner, self.plant, self.trees = inner, plant, False
        self.name = inner.name

    def start(self, prompt_ids, cache):
        self.inner.start(prompt_ids, cache)

    def propose(self, context, gamma, warp, rng):
        d = self.inner.propose(context, gamma, warp, rng)
        if d.parents is None or len(d.tokens) == 0:
            return d
        self.trees = True
        if not self.plant:
            return d
        if d.siblings == "deterministic":  # top-k candidates verified as if drawn from q
            return Draft(d.tokens, d.q, d.parents, "independent")
        q = np.array([d.q[p] if p >= 0 else d.q[i] for i, p in enumerate(d.parents)])
        return Draft(d.tokens, q, d.parents, d.siblings)  # each node with its parent's q

    def target_forward(self, unseen, draft, cache):
        return self.inner.target_forward(unseen, draft, cache)

    def accept(self, context, hidden):
        self.inner.accept(context, hidden)
