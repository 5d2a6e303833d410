"""Real published metadata, read the way `minispec.load` reads it.

tests/data/real/ holds config.json, generation_config.json, tokenizer_config.json and a few small
tokenizer.json files copied verbatim from public repositories (MANIFEST.tsv: the source repository,
path and commit of each, its model family, and what minispec must do with it). Every supported
family's config.json is accepted (unless the MANIFEST says why it is broken as published); every
other family's is refused with a MinispecError naming the file and the family or field; the files
read for special tokens never fail a load over a field minispec ignores.
"""

import csv
import dataclasses
import shutil
import warnings
from pathlib import Path

import pytest

from minispec.config import FAMILIES, ModelConfig, read_config
from minispec.errors import MinispecError
from minispec.loader import _special_tokens, read_special_tokens_file
from minispec.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data" / "real"
ROWS = list(csv.DictReader((DATA / "MANIFEST.tsv").open(encoding="utf-8"), delimiter="\t"))
BY_FILE = {row["file"]: row for row in ROWS}


def _rows(name: str) -> list:
    return [pytest.param(r, id=r["file"]) for r in ROWS if r["file"].endswith("/" + name)]


def test_the_manifest_describes_every_file_and_nothing_else():
    on_disk = {p.relative_to(DATA).as_posix() for p in DATA.rglob("*.json")}
    assert on_disk == set(BY_FILE)
    for row in ROWS:
        assert row["expect"] in ("load", "refuse", "read") and len(row["commit"]) == 40
        assert row["file"] == f"{row['repo']}/{row['path']}"
        # a supported family's config.json is refused only with the reason written down
        if row["expect"] == "refuse" and row["family"] in FAMILIES:
            assert row["note"], row["file"]


@pytest.mark.parametrize("row", _rows("config.json"))
def test_config_json(row):
    path = DATA / row["file"]
    if row["expect"] == "load":
        assert read_config(path).family == row["family"]
        return
    with pytest.raises(MinispecError) as e:
        read_config(path)
    message = str(e.value)
    assert message.startswith(str(path))
    # it names what is wrong: the unsupported family, or the field
    assert f"model_type {row['family']!r}" in message or "field '" in message, message


def _unreadable(row) -> bool:
    return row["note"].startswith("not valid JSON as published")


def _stub_tokenizer() -> Tokenizer:
    """A word-level tokenizer knowing the special tokens these files name, for _special_tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    words = ["[UNK]", "<s>", "</s>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
             "<|im_end|>", "<|eot_id|>", "a"]
    return Tokenizer(HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                                  unk_token="[UNK]")))


@pytest.mark.parametrize("row", _rows("generation_config.json") + _rows("tokenizer_config.json"))
def test_special_tokens_files(row, tmp_path):
    """Read alone, then through _special_tokens as load() does (with a stand-in tokenizer, so the
    tokenizer_config fields load() reads, bos/eos/add_bos_token, are all exercised)."""
    path = DATA / row["file"]
    shutil.copyfile(path, tmp_path / path.name)
    # a vocabulary holding every id these files name (load() checks them against it)
    config = ModelConfig(family="llama", vocab_size=2**18, hidden_size=8, n_layers=1, n_heads=2,
                         intermediate_size=16, max_position_embeddings=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert isinstance(read_special_tokens_file(path), dict)
        out = _special_tokens(config, tmp_path, _stub_tokenizer())
    # only a file that is not JSON at all is set aside, and then with a warning naming it
    assert [str(w.message).split(":")[0] for w in caught] == (
        [str(path), str(tmp_path / path.name)] if _unreadable(row) else [])
    assert all(isinstance(i, int) and i >= 0 for i in out.eos_token_ids)


@pytest.mark.parametrize("row", _rows("tokenizer.json"))
def test_tokenizer_json(row):
    """minispec's Tokenizer reads the file and tokenizes as the tokenizers library does with it."""
    from tokenizers import Tokenizer as HFTokenizer

    path = DATA / row["file"]
    tok, theirs = Tokenizer.from_file(path), HFTokenizer.from_file(str(path))
    text = "Hello world, 123! Ünïcode 文字"
    ids = tok.encode(text, add_bos=False)
    assert ids == theirs.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == theirs.decode(ids, skip_special_tokens=False)


def _model_dirs() -> list:
    dirs = sorted({(DATA / r["file"]).parent for r in ROWS
                   if r["file"].endswith("/config.json") and r["expect"] == "load"})
    return [pytest.param(d, id=d.relative_to(DATA).as_posix()) for d in dirs]


@pytest.mark.parametrize("directory", _model_dirs())
def test_a_supported_directory_reads_as_load_reads_it(directory):
    """config.json, then tokenizer.json, then the special tokens: load()'s metadata path."""
    config = read_config(directory / "config.json")
    tok = (Tokenizer.from_file(directory / "tokenizer.json")
           if (directory / "tokenizer.json").exists() else None)
    unreadable = any(_unreadable(r) for r in ROWS if (DATA / r["file"]).parent == directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _special_tokens(config, directory, tok)
    assert len(caught) == unreadable
    assert dataclasses.replace(out, bos_token_id=config.bos_token_id,
                               eos_token_id=config.eos_token_id,
                               eos_token_ids=config.eos_token_ids) == config
    if tok is not None:
        assert tok.eos_id == out.eos_token_id


def test_the_corpus_covers_what_it_claims():
    """The corpus spans every supported family, a dozen others, 100+ files, 50+ repositories."""
    config_rows = [r for r in ROWS if r["file"].endswith("/config.json")]
    supported = {r["family"] for r in config_rows if r["expect"] == "load"}
    unsupported = {r["family"] for r in config_rows if r["family"] not in FAMILIES}
    assert supported == set(FAMILIES)
    assert len(unsupported) >= 12
    assert len(ROWS) >= 100 and len({r["repo"] for r in ROWS}) >= 50


def _fields(c) -> dict:
    """What the math depends on, from a minispec ModelConfig or a transformers config object."""
    if isinstance(c, ModelConfig):
        return {"D": c.hidden_size, "L": c.n_layers, "H": c.n_heads, "K": c.n_kv_heads,
                "E": c.head_dim, "F": c.intermediate_size, "P": c.max_position_embeddings,
                "eps": c.norm_eps, "tie": c.tie_word_embeddings, "V": c.vocab_size,
                "theta": c.rope_theta if c.family != "gpt2" else None,
                "scaling": (c.rope_scaling or {}).get("factor"),
                "window": c.sliding_window, "bias": c.attention_bias}
    if c.model_type == "gpt2":
        return {"D": c.n_embd, "L": c.n_layer, "H": c.n_head, "K": c.n_head,
                "E": c.n_embd // c.n_head, "F": c.n_inner or 4 * c.n_embd, "P": c.n_positions,
                "eps": c.layer_norm_epsilon, "tie": c.tie_word_embeddings, "V": c.vocab_size,
                "theta": None, "scaling": None, "window": None, "bias": False}
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    return {"D": c.hidden_size, "L": c.num_hidden_layers, "H": c.num_attention_heads,
            "K": c.num_key_value_heads, "E": getattr(c, "head_dim", None)
            or c.hidden_size // c.num_attention_heads, "F": c.intermediate_size,
            "P": c.max_position_embeddings, "eps": c.rms_norm_eps, "tie": c.tie_word_embeddings,
            "V": c.vocab_size, "theta": theta,
            "scaling": rope.get("factor") if rope.get("rope_type", "default") != "default"
            else None, "window": c.sliding_window if c.model_type == "mistral" else None,
            "bias": getattr(c, "attention_bias", c.model_type == "qwen2")}


@pytest.mark.parametrize("row", [r for r in _rows("config.json")
                                 if r.values[0]["expect"] == "load"])
def test_accepted_configs_read_as_transformers_reads_them(row):
    transformers = pytest.importorskip("transformers", reason="the cross-check needs transformers")
    import json

    path = DATA / row["file"]
    ours = read_config(path)
    theirs = transformers.CONFIG_MAPPING[ours.family].from_dict(json.loads(path.read_text()))
    assert _fields(ours) == _fields(theirs)
