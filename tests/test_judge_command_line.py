"""The judge's command line (`python -m minispec judge`, verify_distribution.py): every argument
checked before any work, a bad one refused with exit status 2 and one line naming it and what was
expected; `minispec.judge.main` stays the function whatever was imported before."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import minispec.judge
from minispec.judge import main

ROOT = Path(__file__).resolve().parents[1]


def refused(capsys, *args: str) -> str:
    """Run the judge in this process on a bad command line -> its one line on stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert out == "", out  # nothing ran: no header, no table
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, words", [
    (["--sampler", "nope:fn"], ["--sampler nope:fn: no module 'nope'",
                                "fn(p, q, draft_tokens, rng)"]),
    (["--sampler", "no_colon_here"], ["--sampler: expected", "MODULE:NAME"]),
    (["--sampler", "samplers_for_tests:nope"], ["samplers_for_tests has no 'nope'"]),
    (["--generator", "nope.deeper:factory"], ["--generator nope.deeper:factory: no module 'nope'",
                                              "factory(target_dir, draft_dir)"]),
    (["--drafter", "nope:factory", "--quick"], ["--drafter nope:factory: no module 'nope'"]),
    (["--drafter", "samplers_for_tests:missing"], ["--drafter", "has no 'missing'",
                                                   "minispec.Drafter"]),
    (["--drafter", "ngarm"], ["--drafter: expected one of minispec's drafters (ngram,",
                              "got 'ngarm'"]),
    (["--quick", "--plot", "out.txt"], ["--plot out.txt: expected a file name ending in",
                                        ".png", ".pdf", ".svg"]),
    (["--quick", "--plot", "out"], ["--plot out: expected a file name ending in"]),
    (["--samples", "-5"], ["--samples", "expected a positive integer, got '-5'"]),
    (["--drafter", "ngram", "--quick", "--samples", "0"], ["--samples",
                                                           "positive integer, got '0'"]),
    (["--generator", "minispec.generators:speculative", "--samples", "many"],
     ["--samples", "positive integer, got 'many'"]),
    (["--samples", "100"], ["--samples: goes with --generator or --drafter"]),
    (["--drafter", "ngram", "--quick", "--samples", "10000001"],
     ["--samples: at most 10,000,000 per configuration", "got 10,000,001"]),
    (["--seed", "-1"], ["--seed", "expected an integer >= 0, got '-1'"]),
    (["--quick", "--weights", "weights"], ["--weights: goes with a full run"]),
    (["--sampler", "a:b", "--generator", "c:d"], ["--generator: not allowed with",
                                                   "--sampler"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
])
def test_a_bad_command_line_is_one_line_and_exit_2_before_any_work(capsys, args, words):
    err = refused(capsys, *args)
    assert err.startswith("python -m minispec judge: error: "), err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("args, words", [
    (["--drafter", "os:getcwd", "--quick"],  # a function of another signature
     ["--drafter os:getcwd: calling it as factory(target, draft) failed: TypeError"]),
    (["--generator", "json:dumps", "--quick"],
     ["--generator json:dumps: calling it as factory(target_dir, draft_dir) failed: TypeError"]),
])
def test_a_factory_that_cannot_be_called_so_is_one_line_not_a_traceback(capsys, args, words):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_a_plot_into_a_missing_folder_or_without_matplotlib_is_refused_up_front(
        capsys, tmp_path, monkeypatch):
    err = refused(capsys, "--quick", "--plot", str(tmp_path / "nowhere" / "out.png"))
    assert "the folder" in err and "does not exist" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    err = refused(capsys, "--quick", "--plot", str(tmp_path / "out.png"))
    assert "--plot" in err and "needs matplotlib" in err and "minispec[plot]" in err


def test_a_module_that_fails_to_import_is_named_with_its_error(capsys, tmp_path, monkeypatch):
    (tmp_path / "broken_mod.py").write_text("import a_package_that_is_not_installed\n")
    (tmp_path / "raising_mod.py").write_text("raise RuntimeError('half-written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    err = refused(capsys, "--sampler", "broken_mod:verify")
    assert "importing broken_mod failed" in err and "a_package_that_is_not_installed" in err
    assert "REQUIRES" in err  # how to make it exit 3, nothing tested, instead
    err = refused(capsys, "--drafter", "raising_mod:factory")
    assert "raised RuntimeError: half-written" in err


def test_a_drafter_factory_that_makes_no_drafter_is_named(capsys, tmp_path, monkeypatch):
    (tmp_path / "not_a_drafter.py").write_text("def factory(target, draft):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--drafter", "not_a_drafter:factory", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--drafter not_a_drafter:factory: the factory returned int, not a minispec.Drafter" \
        in err and len(err.splitlines()) == 1


@pytest.mark.slow  # importing matplotlib and drawing: a second or more
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_a_plot_is_drawn_where_asked(capsys, tmp_path):
    png = tmp_path / "judge.png"
    code = main(["--drafter", "ngram", "--quick", "--samples", "100", "--plot", str(png)])
    out = capsys.readouterr().out
    assert code in (0, 1)  # 100 samples: the rows are there, the controls may lack power
    assert f"wrote {png}" in out and png.read_bytes()[:4] == b"\x89PNG"


def test_main_stays_the_function_after_its_submodule_is_imported(capsys):
    # the submodule minispec.judge.main (the command line itself) shares the function's name;
    # importing it must not turn the package's `main` into a module
    submodule = importlib.import_module("minispec.judge.main")
    assert callable(minispec.judge.main) and minispec.judge.main is main
    assert sys.modules["minispec.judge.main"] is submodule and hasattr(submodule, "advice")
    from minispec.judge import main as again

    assert again is main and again(["--seed", "-1"]) == 2
    from minispec.cli import main as cli_main  # imports minispec.judge's main on every call

    assert cli_main(["judge", "--seed", "-1"]) == 2 and cli_main(["judge", "--seed", "-2"]) == 2
    assert "--seed" in capsys.readouterr().err


def test_the_command_exits_2_with_one_line_for_a_module_it_cannot_import():
    # the one subprocess test of a bad command line: the real exit status and stderr, no
    # traceback (in-process tests above cover the messages)
    r = subprocess.run([sys.executable, "-m", "minispec", "judge", "--sampler", "nope:fn"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--sampler nope:fn: no module 'nope'" in r.stderr
