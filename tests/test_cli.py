"""The command line: generation, --compare, --trace, the interactive prompt, and its errors."""

import io
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from minispec.cli import main, shipped_pair
from minispec.config import ModelConfig
from minispec.errors import MinispecError
from minispec.loader import random_model, save_checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random target/draft pair sharing a byte-level BPE tokenizer, written to disk."""
    root = tmp_path_factory.mktemp("pair")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20, trainer)
    for name, layers, seed in [("target", 2, 0), ("draft", 1, 1)]:
        cfg = ModelConfig(family="llama", vocab_size=tok.get_vocab_size(), hidden_size=32,
                          n_layers=layers, n_heads=4, n_kv_heads=2, intermediate_size=64,
                          max_position_embeddings=128)
        save_checkpoint(random_model(cfg, seed=seed, scale=0.1), root / name)
        tok.save(str(root / name / "tokenizer.json"))
    return root / "target", root / "draft"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_compare_trace(pair, capsys):
    target, draft = pair
    rc, out, _ = run(capsys, "--target", target, "--draft", draft, "--prompt", "def f(x):",
                     "--max-new-tokens", 10, "--gamma", 3, "--compare", "--trace", "--no-color",
                     "--device", "cpu")
    assert rc == 0
    assert out.startswith("def f(x):")  # the text first, streamed round by round
    assert "\naccepted ~rejected~ [->correction] [+bonus]\n" in out  # then the trace
    calls = int(re.search(r"(\d+) target calls", out).group(1))
    # one trace line per round
    assert len(re.findall(r"^round +\d+ \|", out, re.MULTILINE)) == calls
    assert "speculative (model drafter): 10 tokens" in out
    assert "autoregressive: 10 tokens, 10 target calls" in out
    assert "outputs identical" in out  # greedy: speculative == autoregressive, token for token
    assert re.search(r"speedup: \d+\.\d\dx", out)


@pytest.mark.parametrize("drafter", ["ngram", "early-exit"])
def test_drafters_need_no_draft_model(pair, capsys, drafter):
    target, _ = pair
    rc, out, _ = run(capsys, "--target", target, "--drafter", drafter, "--prompt", "def f(x):",
                     "--max-new-tokens", 5, "--device", "cpu")
    assert rc == 0
    assert f"speculative ({drafter} drafter): 5 tokens" in out


def test_interactive_commands(pair, capsys, monkeypatch):
    target, draft = pair
    lines = ["/gamma 2", "/temperature 0.7", "/top_k 5", "/top_p 0.9", "/length 3", "/trace",
             "/help", "def f", "/speculative", "def f", "/gamma x", "/bogus", "/quit"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    rc, out, _ = run(capsys, "--target", target, "--draft", draft, "--no-color", "--device", "cpu")
    assert rc == 0
    for echo in ["gamma = 2", "temperature = 0.7", "top_k = 5", "top_p = 0.9", "length = 3",
                 "trace on", "/drafter NAME", "plain autoregressive decoding"]:
        assert echo in out
    assert "speculative (model drafter): 3 tokens" in out
    assert "autoregressive: 3 tokens" in out
    assert "gamma: expected a positive integer or 'auto'" in out
    assert "unknown command" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gamma", "0"], "gamma"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--drafter", "early-exit", "--exit-layer", "9"], "exit_layer"),
        (["--threads", "0"], "threads"),
    ],
)
def test_bad_parameters_exit_2_naming_them(pair, capsys, argv, message):
    target, draft = pair
    rc, _, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "x",
                     "--device", "cpu", *argv)
    assert rc == 2
    assert err.startswith("minispec: error:") and message in err


def test_missing_model_directory_is_a_clear_error(tmp_path, capsys):
    rc, _, err = run(capsys, "--target", tmp_path / "nowhere", "--prompt", "x", "--device", "cpu")
    assert rc == 2 and "nowhere" in err


def test_shipped_pair_is_the_default(capsys):
    target, draft = shipped_pair()
    if not (target / "model.safetensors").exists() or not (draft / "model.safetensors").exists():
        pytest.skip(f"the shipped pair is not in {target.parent}")
    rc, out, _ = run(capsys, "--prompt", "import os\n", "--max-new-tokens", 6, "--device", "cpu")
    assert rc == 0
    assert "speculative (model drafter): 6 tokens" in out


class _Session:
    """What command() needs of a Session: settings and a drafter to build."""

    def __init__(self):
        from minispec.cli import Settings

        self.settings = Settings()
        self.built = []

    def drafter(self):
        self.built.append(self.settings.drafter)
        if self.settings.drafter == "medusa":
            raise MinispecError("weights/medusa: not a Medusa heads directory")


@pytest.mark.parametrize("line, setting", [
    ("/gamma 0", "gamma"), ("/gamma x", "gamma"), ("/temperature -1", "sampling"),
    ("/top_p 2", "sampling"), ("/top_k -3", "sampling"), ("/length 0", "max_new_tokens"),
    ("/drafter foo", "drafter"), ("/drafter medusa", "drafter"), ("/gamma", "gamma")])
def test_every_slash_command_checks_its_value_at_once(capsys, line, setting):
    from minispec.cli import command

    session = _Session()
    before = getattr(session.settings, setting)
    assert command(session, line) is True
    out = capsys.readouterr().out
    assert out.startswith("error: /")  # one wording for every bad value
    assert getattr(session.settings, setting) == before  # the setting is unchanged


def test_settings_and_good_values(capsys):
    from minispec.cli import command

    session = _Session()
    for line in ("/gamma auto", "/temperature 0.7", "/top_k 5", "/drafter ngram", "/seed 3"):
        command(session, line)
    command(session, "/settings")
    out = capsys.readouterr().out
    assert "gamma        auto" in out and "temperature  0.7" in out and "top_k 5" in out
    assert "drafter      ngram" in out and "seed         3" in out
    assert session.built == ["ngram"]  # the drafter was built when chosen
    assert command(session, "/quit") is False


def test_a_capped_length_is_said(pair, capsys):
    target, draft = pair
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "def f(x):",
                       "--max-new-tokens", 100000, "--device", "cpu")
    assert rc == 0 and "is capped" in err and "max_new_tokens 100000" in err


def test_every_flag_the_readme_shows_exists():
    from pathlib import Path

    from minispec.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme[readme.index("## The command line"):readme.index("## How it is built")]
    named = set(re.findall(r"(--[a-z][a-z-]+)", block.split("python -m minispec bench")[0]))
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert named and named <= known, named - known
    drafters = re.search(r"--drafter ([a-z|-]+)\]", block).group(1).split("|")
    assert set(drafters) == set(build_parser()._option_string_actions["--drafter"].choices)


def test_help_shows_each_default_once(capsys):
    """--help names the default of every option that has one, once: no "(default: None)" after a
    help text that already describes it, no "(default: False)" on a flag."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert text.count("(default: a quarter)") == 1
    assert f"(default: {shipped_pair()[0]})" in text
    for flag, default in (("--gamma", "4"), ("--max-new-tokens", "64"), ("--seed", "0")):
        assert re.search(re.escape(flag) + r" [A-Z_]+ [^-]*\(default: " + default + r"\)", text)
