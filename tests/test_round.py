"""The round's contract (minispec/core/speculative.py, minispec/core/drafter.py): the verify step is
a parameter, every drafter is driven through the same four methods, what the drafter hands back
is checked, what the target computed reaches the drafter, and minispec/ has no import cycle."""

import ast
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config
from samplers_for_tests import exact, residual_is_p

from minispec import Draft, Drafter, MinispecError, Request, Sampling, generate
from minispec.backend import to_host
from minispec.core.speculative import autoregressive_generate, speculative_generate
from minispec.core.verify import verify
from minispec.drafters import ModelDrafter, NoDrafter
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(n_layers=1), seed=0, scale=0.4)
PROMPT = [3, 17, 5, 42, 8]
GREEDY = {"temperature": 0.0}


def test_an_outside_verify_step_runs_in_the_real_loop():
    calls = []

    def counting(p, q, draft_tokens, rng):
        calls.append(len(draft_tokens))
        return exact(p, q, draft_tokens, rng)

    ar = autoregressive_generate(TARGET, PROMPT, max_new_tokens=20, **GREEDY)
    sd = speculative_generate(TARGET, DRAFT, PROMPT, gamma=3, max_new_tokens=20, verify=counting,
                              **GREEDY)
    assert sd.tokens == ar.tokens  # an exact outside sampler: the target's greedy output
    assert calls == [len(r.drafted) for r in sd.stats.rounds]


def test_the_verify_parameter_is_what_decides():
    # a broken verify step (resampling from p after a rejection) changes sampled output, so the
    # loop really calls the step it is given, not its own
    kw = {"gamma": 4, "max_new_tokens": 30, "temperature": 1.0, "seed": 3}
    a = speculative_generate(TARGET, DRAFT, PROMPT, **kw).tokens
    b = speculative_generate(TARGET, DRAFT, PROMPT, verify=verify, **kw).tokens
    c = speculative_generate(TARGET, DRAFT, PROMPT, verify=residual_is_p, **kw).tokens
    assert a == b and a != c


@pytest.mark.parametrize("returns", [[], [99], [1.5], "x", [[0, 1]], [[1]], np.array([[1]]),
                                     None, [1, [2]]])
def test_a_verify_that_breaks_the_contract_is_named(returns):
    def bad_verify(p, q, draft_tokens, rng):
        return returns

    with pytest.raises(MinispecError, match="verify bad_verify"):
        speculative_generate(TARGET, DRAFT, PROMPT, gamma=2, max_new_tokens=5, verify=bad_verify,
                             **GREEDY)


class Returns(Drafter):
    """A drafter whose propose returns whatever it is told to."""

    name = "returns"

    def __init__(self, target, value):
        super().__init__(target)
        self.value = value

    def propose(self, context, gamma, warp, rng):
        return self.value


V = TARGET.vocab_size
BAD_DRAFTS = [
    (None, "must return a Draft"),
    ((np.array([1]), np.ones((1, V)) / V), "must return a Draft"),
    (Draft(np.array([1, 2, 3]), np.ones((3, V)) / V), "at most 2"),
    (Draft(np.array([[1]]), np.ones((1, V)) / V), "1-D integer array"),
    (Draft(np.array(["a"]), np.ones((1, V)) / V), "1-D integer array"),
    (Draft(np.array([1]), np.ones(V) / V), "q must be"),
    (Draft(np.array([1]), np.ones((1, V - 1)) / V), "q must be"),
    (Draft(np.array([V]), np.ones((1, V)) / V), "0..47"),
]


@pytest.mark.parametrize("value, match", BAD_DRAFTS)
def test_a_drafter_that_breaks_the_contract_is_named(value, match):
    with pytest.raises(MinispecError, match=f"drafter 'returns'.*{match}"):
        speculative_generate(TARGET, Returns(TARGET, value), PROMPT, gamma=2, max_new_tokens=5,
                             **GREEDY)


def test_what_is_not_a_drafter_or_a_model_is_refused():
    for bad in (None, "model", object()):
        with pytest.raises(MinispecError, match="drafter"):
            speculative_generate(TARGET, bad, PROMPT, max_new_tokens=3, **GREEDY)
    with pytest.raises(MinispecError, match="target"):
        speculative_generate("target", DRAFT, PROMPT, max_new_tokens=3, **GREEDY)


class Recording(ModelDrafter):
    """A model drafter that records every call the loop makes and what accept() is handed."""

    def __init__(self, target, model):
        super().__init__(target, model)
        self.log, self.hidden = [], []

    def start(self, prompt_ids, cache):
        self.log.append("start")
        super().start(prompt_ids, cache)

    def propose(self, context, gamma, warp, rng):
        self.log.append("propose")
        return super().propose(context, gamma, warp, rng)

    def target_forward(self, tokens, cache, n_logits):
        self.log.append("target_forward")
        return super().target_forward(tokens, cache, n_logits)

    def accept(self, context, hidden):
        self.log.append("accept")
        self.hidden.append((list(context), to_host(hidden)))
        super().accept(context, hidden)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_accept_receives_the_targets_hidden_states_of_the_kept_positions(temperature):
    d = Recording(TARGET, DRAFT)
    r = speculative_generate(TARGET, d, PROMPT, gamma=3, max_new_tokens=24,
                             temperature=temperature, seed=1)
    rounds = len(r.stats.rounds)
    assert d.log == ["start"] + ["propose", "target_forward", "accept"] * rounds
    for context, hidden in d.hidden:
        # rows are positions len(context)-1-n .. len(context)-2; through the target's head they
        # are the logits a full recompute gives there
        n = hidden.shape[0]
        reference = TARGET.logits(context)[len(context) - 1 - n: len(context) - 1]
        np.testing.assert_allclose(to_host(TARGET.lm_head(hidden)), reference, rtol=1e-4, atol=1e-4)
    # every position but the last is handed over exactly once across the rounds
    assert sum(h.shape[0] for _, h in d.hidden) == len(PROMPT) + len(r.tokens) - 1


def test_generate_takes_the_settings_as_values():
    sampling, request = Sampling(temperature=0.0), Request(max_new_tokens=12, seed=0)
    a = generate(TARGET, ModelDrafter(TARGET, DRAFT), PROMPT, sampling, request, gamma="auto")
    b = generate(TARGET, NoDrafter(TARGET), PROMPT, sampling, request, gamma=0)
    assert a.tokens == b.tokens and b.stats.drafter == "none" and b.stats.drafted == 0
    assert a.stats.gamma == "auto" and a.stats.drafter == "model"
    with pytest.raises(MinispecError, match="temperature"):
        Sampling(temperature=-1)
    with pytest.raises(MinispecError, match="max_new_tokens"):
        Request(max_new_tokens=0)
    assert Request(5, eos_token_ids=7).eos_token_ids == (7,)


def test_on_round_sees_each_round_as_it_is_done():
    seen = []
    r = generate(TARGET, ModelDrafter(TARGET, DRAFT), PROMPT, Sampling(), Request(15),
                 on_round=lambda rd: seen.append((rd, len(seen))))
    assert [rd for rd, _ in seen] == r.stats.rounds
    assert sum(len(rd.emitted) for rd, _ in seen) == len(r.tokens)


def test_a_gamma_policy_of_ones_own_is_followed():
    class Alternate:
        def __init__(self):
            self.gamma, self.seen = 1, []

        def update(self, depth, accepted):
            self.seen.append((depth, accepted))
            self.gamma = 3 if self.gamma == 1 else 1

    policy = Alternate()
    r = generate(TARGET, ModelDrafter(TARGET, DRAFT), PROMPT, Sampling(), Request(20),
                 gamma=policy)
    asked = [rd.gamma for rd in r.stats.rounds]
    assert asked[:4] == [1, 3, 1, 3]
    assert policy.seen == [(len(rd.drafted), rd.accepted) for rd in r.stats.rounds]
    assert all(rd.depth == len(rd.drafted) for rd in r.stats.rounds)  # a chain's depth


def _imports(path: Path, package: str) -> set[str]:
    """The minispec modules `path` imports at module level or in functions (relative or not)."""
    tree = ast.parse(path.read_text())
    here = package.split(".")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [f"{mod}.{a.name}" for a in node.names] + [mod]
            elif node.module and node.module.startswith("minispec"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            out.update(names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("minispec"))
    return out


def test_no_import_cycle_in_minispec():
    root = Path(__file__).resolve().parents[1] / "minispec"
    modules = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        modules[name] = (path, package)
    graph = {name: {m for m in _imports(path, pkg) if m in modules and m != name}
             for name, (path, pkg) in modules.items()}
    # a package's __init__ re-exporting its submodules is not a cycle through them
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    done, stack = set(), []

    def visit(n):
        if n in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
        if n in done:
            return
        stack.append(n)
        for m in sorted(graph[n]):
            visit(m)
        stack.pop()
        done.add(n)

    for n in sorted(graph):
        visit(n)
    assert len(done) == len(modules) > 10
