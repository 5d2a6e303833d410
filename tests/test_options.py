"""One source of defaults: the options every subcommand shares come from minispec/options.py."""

import re

import pytest

import minispec
from minispec.core.speculative import DEFAULT_GAMMA
from minispec.errors import MinispecError
from minispec.options import parse_gamma

SHARED = {  # subcommand -> the shared options it takes
    None: ("--gamma", "--device", "--dtype", "--threads"),
    "bench": ("--gamma", "--device", "--threads"),
    "drafters": ("--gamma", "--device", "--dtype", "--threads"),
    "sweep": ("--device", "--threads"),
    "roofline": ("--device", "--dtype"),
    "crossover": ("--gamma", "--threads"),
    "serve": ("--gamma", "--threads"),
}


def help_of(sub, capsys) -> str:
    from minispec.cli import main

    with pytest.raises(SystemExit) as e:
        main(([sub] if sub else []) + ["--help"])
    assert e.value.code == 0
    return re.sub(r"\s+", " ", capsys.readouterr().out)


@pytest.mark.parametrize("sub", list(SHARED), ids=lambda s: s or "main")
def test_every_subcommand_takes_the_shared_options_with_one_default(sub, capsys):
    text = help_of(sub, capsys)
    for flag in SHARED[sub]:
        assert flag in text
    if "--device" in SHARED[sub]:
        assert "--device {auto,cpu,gpu} where the models run (auto: the GPU when CuPy" in text
    if "--threads" in SHARED[sub]:
        assert "--threads THREADS BLAS threads for NumPy during the run (a decode step" in text
    shown = re.search(r"--gamma GAMMA [^-]*?\(default: (\w+)\)", text)
    if shown:  # where the parser prints defaults
        assert shown.group(1) == "4"


def test_the_api_and_the_command_line_share_one_gamma():
    assert DEFAULT_GAMMA == 4
    import inspect

    for fn in (minispec.speculative_generate, minispec.generate, minispec.generate_batch):
        assert inspect.signature(fn).parameters["gamma"].default == DEFAULT_GAMMA


@pytest.mark.parametrize("text, auto, expected", [
    ("4", True, 4), (" 7 ", True, 7), ("auto", True, "auto"), ("AUTO", True, "auto"),
    ("3", False, 3)])
def test_parse_gamma_reads_a_gamma(text, auto, expected):
    assert parse_gamma(text, auto=auto) == expected


@pytest.mark.parametrize("text, auto", [("0", True), ("-2", True), ("x", True), ("1.5", True),
                                        ("", True), ("auto", False)])
def test_parse_gamma_names_a_bad_one(text, auto):
    with pytest.raises(MinispecError, match="gamma: expected a positive integer"):
        parse_gamma(text, auto=auto)
