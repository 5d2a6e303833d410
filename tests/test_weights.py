"""The shipped pair in weights/ (issue 4): it loads, decodes as recorded, matches transformers.

GREEDY_TOKENS was recorded once from minispec's greedy autoregressive decoding of PROMPT with the
target (and checked against transformers' greedy decoding of the same BF16 checkpoint in float32);
a change to the model code, the loader or the weights that alters the output shows up here.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from minispec.core.speculative import autoregressive_generate
from minispec.loader import load

WEIGHTS = Path(__file__).resolve().parents[1] / "weights"
PROMPT = "def fibonacci(n):\n    "
GREEDY_TOKENS = [377, 82, 2, 487, 362, 83, 9, 265, 311, 329, 393, 63, 371, 8, 371, 9, 265, 311,
                 293, 313, 371, 26, 288, 293]  # ' "r" % (s)\n        if _get_name(name)\n ...
TOL = 1e-4  # max |logit diff| vs transformers, float32 on both sides, relative to max |logit|

pytestmark = pytest.mark.skipif(not (WEIGHTS / "target" / "model.safetensors").exists(),
                                reason="weights/target is not there (see weights/README.md)")


@pytest.fixture(scope="module")
def target():
    return load(WEIGHTS / "target", device="cpu")


@pytest.fixture(scope="module")
def draft():
    return load(WEIGHTS / "draft", device="cpu")


def test_pair_loads_with_the_documented_shapes(target, draft):
    assert target.config.family == draft.config.family == "llama"
    assert target.vocab_size == draft.vocab_size == 4096
    assert target.n_layers == 5 and draft.n_layers == 1
    assert target.config.n_kv_heads < target.config.n_heads  # grouped-query attention
    assert target.config.max_position_embeddings == draft.config.max_position_embeddings == 512
    assert target.config.bos_token_id == draft.config.bos_token_id == 0
    assert target.config.eos_token_id == draft.config.eos_token_id == 0


def test_target_is_bf16_draft_is_f16():
    for name, dtype in (("target", "BF16"), ("draft", "F16")):
        raw = (WEIGHTS / name / "model.safetensors").read_bytes()[:200_000]
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {dtype}, name


def test_pair_shares_the_tokenizer(target, draft):
    t = (WEIGHTS / "target" / "tokenizer.json").read_bytes()
    d = (WEIGHTS / "draft" / "tokenizer.json").read_bytes()
    assert t == d
    text = "for i in range(10):\n    print(i)\n"
    ids = target.tokenizer.encode(text)
    assert ids == draft.tokenizer.encode(text)
    assert ids[0] == 0 and target.tokenizer.decode(ids, skip_special_tokens=True) == text


def test_weights_fit_the_size_bound():
    # the project's bound for weights/: 64 MB in all (the pair, the heads for both targets, the
    # plots, the recipes); 55 MB with SmolLM2's heads
    total = sum(f.stat().st_size for f in WEIGHTS.rglob("*") if f.is_file())
    assert total <= 64 * 10**6


def test_prompts_are_held_out_and_short(target):
    prompts = json.loads((WEIGHTS / "prompts.json").read_text())["prompts"]
    assert len(prompts) >= 50
    import hashlib
    for p in prompts:
        assert int(hashlib.md5(p["file"].encode()).hexdigest(), 16) % 20 == 0, p["file"]
        assert 32 <= len(target.tokenizer.encode(p["text"], add_bos=False)) <= 128


def test_greedy_output_is_the_recorded_one(target):
    ids = target.tokenizer.encode(PROMPT)
    out = autoregressive_generate(target, ids, max_new_tokens=len(GREEDY_TOKENS), temperature=0)
    assert out.tokens == GREEDY_TOKENS


@pytest.mark.parametrize("name", ["target", "draft"])
def test_parity_with_transformers(name, target, draft):
    torch = pytest.importorskip("torch",
                                reason="parity needs torch (pip install 'minispec[parity]')")
    transformers = pytest.importorskip(
        "transformers", reason="parity needs transformers (pip install 'minispec[parity]')")
    model = {"target": target, "draft": draft}[name]
    hf = transformers.LlamaForCausalLM.from_pretrained(WEIGHTS / name, dtype=torch.float32).eval()
    ids = model.tokenizer.encode(PROMPT + "a, b = 0, 1\n    for _ in range(n):\n")
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0].numpy()
    ours = model.logits(ids)
    assert np.abs(ours - ref).max() <= TOL * np.abs(ref).max()


def test_transformers_greedy_agrees_with_the_recording():
    torch = pytest.importorskip("torch", reason="needs torch (pip install 'minispec[parity]')")
    transformers = pytest.importorskip(
        "transformers", reason="needs transformers (pip install 'minispec[parity]')")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(WEIGHTS / "target" / "tokenizer.json"))
    hf = transformers.LlamaForCausalLM.from_pretrained(WEIGHTS / "target",
                                                       dtype=torch.float32).eval()
    ids = tok.encode(PROMPT).ids  # the tokenizer's post-processor puts the BOS in front
    assert ids[0] == 0
    with torch.no_grad():
        # (EOS, id 0, does not come up in these tokens; the generation_config's EOS is kept)
        out = hf.generate(torch.tensor([ids]), max_new_tokens=len(GREEDY_TOKENS), do_sample=False,
                          pad_token_id=0)
    assert out[0, len(ids):].tolist() == GREEDY_TOKENS
