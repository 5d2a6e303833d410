"""The command line: generation, --compare, --trace, the interactive prompt, and its errors."""

import io
import json
import re
import sys

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import minispec
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
    assert "\naccepted ~rejected~ [->correction] [+bonus]  (· is a space" in out  # the trace
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
    assert "error: gamma: expected a positive integer or 'auto', got 'x'" in out  # one prefix
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
    ("/drafter foo", "drafter"), ("/drafter medusa", "drafter"), ("/gamma", "gamma"),
    ("/seed -1", "seed"), ("/seed 1.5", "seed"), ("/length x", "max_new_tokens"),
    ("/trace yes", "trace"), ("/speculative 2", "speculative")])
def test_every_slash_command_checks_its_value_at_once(capsys, line, setting):
    from minispec.cli import command

    session = _Session()
    before = getattr(session.settings, setting)
    assert command(session, line) is True
    out = capsys.readouterr().out
    assert out.startswith("error: ")  # one wording for every bad value, one prefix:
    assert not re.match(r"error: /(\w+): \1", out), out  # not "error: /gamma: gamma: ..."
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


def test_every_flag_the_docs_show_exists():
    from pathlib import Path

    from minispec.cli import build_parser

    block = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    named = set(re.findall(r"(--[a-z][a-z-]+)", block.split("python -m minispec bench")[0]))
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert named and named <= known, named - known
    assert known - {"-h", "--help"} <= named, known - named  # every flag in the synopsis
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
    assert "(default: shipped:target)" in text
    for flag, default in (("--gamma", "4"), ("--max-new-tokens", "64"), ("--seed", "0")):
        assert re.search(re.escape(flag) + r" [A-Z_]+ [^-]*\(default: " + default + r"\)", text)


# ---- what a new user tripped on (issue 26) ------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "seed: expected None or an integer >= 0, got -1"),
    (["--max-new-tokens", "0"], "max_new_tokens: expected an integer >= 1, got 0"),
    (["--drafter", "early-exit", "--exit-layer", "9"], "exit_layer: expected an integer in"),
    (["--top-k", "-1"], "top_k"),
    (["--prompt", "x = 1\n" * 200], "--prompt: 1000 tokens leave no room for new tokens in the "
                                      "context of 128 positions"),
])
def test_everything_is_checked_before_the_prompt_is_echoed(pair, capsys, argv, message):
    target, draft = pair
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "hi",
                       "--device", "cpu", *argv)
    assert rc == 2 and out == ""  # nothing echoed: the error is not glued to the prompt
    assert err.startswith("minispec: error: ") and err.count("\n") == 1, err  # its own line
    assert message in err


def test_a_prompt_that_is_not_utf8_is_named_with_its_byte(pair, capsys, monkeypatch):
    target, draft = pair
    bad = b"def \xff(x)".decode("utf-8", "surrogateescape")  # what Python makes of such argv
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", bad,
                       "--device", "cpu")
    assert rc == 2 and out == ""
    assert "--prompt: not UTF-8 text: byte 0xff at byte 4" in err
    assert "tokenizer" not in err  # not blamed on tokenizer.json
    stdin = io.TextIOWrapper(io.BytesIO(b"def \xff(x)\n/quit\n"), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)  # the same bytes piped into the interactive prompt
    rc, out, _ = run(capsys, "--target", target, "--draft", draft, "--device", "cpu")
    assert rc == 0 and "error: prompt: not UTF-8 text: byte 0xff at byte 4" in out


def test_html_needs_a_prompt_and_keeps_the_text_and_statistics(pair, capsys, tmp_path):
    target, draft = pair
    page = tmp_path / "gen.html"
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--html", page)
    assert rc == 2 and "--html: needs --prompt" in err and not page.exists()
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "def f(x):",
                       "--max-new-tokens", 6, "--html", page, "--device", "cpu")
    assert rc == 0 and out.startswith("def f(x):")  # the text, then the statistics
    assert "speculative (model drafter): 6 tokens" in out and f"wrote {page}" in out
    assert "try --temperature 1" in out
    assert "the uniform r plays no role" in page.read_text()  # said on the page, at T = 0

    rc, out, _ = run(capsys, "--target", target, "--draft", draft, "--prompt", "def f(x):",
                     "--max-new-tokens", 6, "--html", page, "--temperature", 1, "--device", "cpu")
    assert rc == 0 and "r plays no role" not in page.read_text() + out


def test_html_tables_show_spaces_inside_tokens_as_the_trace_does(capsys, tmp_path):
    """The shipped target indents after `def f(x):`: those tokens' spaces read as '·' in the
    page's tables, as in the terminal trace, and no token there shows a bare space."""
    page = tmp_path / "gen.html"
    rc, out, _ = run(capsys, "--prompt", "def f(x):", "--max-new-tokens", 8, "--html", page,
                     "--device", "cpu")
    codes = re.findall(r"<code>([^<]*)</code>", page.read_text())
    assert rc == 0 and any("\u00b7" in c for c in codes)
    assert not any(" " in c for c in codes if c != "--temperature 1")


def test_html_draws_a_tree_drafter_s_trees(capsys, tmp_path):
    """--html with a tree drafter (it used to be refused): each tree round's tree and walk."""
    page = tmp_path / "tree.html"
    rc, out, _ = run(capsys, "--prompt", "def f(x):", "--max-new-tokens", 8, "--html", page,
                     "--drafter", "medusa", "--tree", "2,2,1,1", "--temperature", 1,
                     "--device", "cpu")
    text = page.read_text()
    assert rc == 0 and f"wrote {page}" in out
    assert "over a tree of 14 nodes" in text and "<th>s(x)</th><th>r(x)</th>" in text


def test_dtype_float16_reaches_the_models(pair, capsys, tmp_path):
    """--dtype float16 (meant for the GPU's tensor cores) loads both models in float16; greedy
    speculative output is still the target's own, and `drafters` says the dtype it ran in."""
    target, draft = pair
    rc, out, _ = run(capsys, "--target", target, "--draft", draft, "--prompt", "def f(x):",
                     "--max-new-tokens", 6, "--dtype", "float16", "--device", "cpu", "--compare")
    assert rc == 0 and "outputs identical" in out
    (tmp_path / "p.txt").write_text("def f(x):\n")
    rc, out, err = run(capsys, "drafters", "--target", target, "--draft", draft, "--drafters",
                       "model", "--prompts", tmp_path / "p.txt", "--num-prompts", 1,
                       "--max-new-tokens", 4, "--temperatures", 0, "--dtype", "float16", "--json")
    assert rc == 0 and json.loads(out)["settings"]["dtype"] == "float16", err
    with pytest.raises(SystemExit):
        run(capsys, "--dtype", "float64", "--prompt", "x")
    assert "--dtype" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sweep", "crossover", "serve"])
def test_plot_without_matplotlib_stops_before_measuring(capsys, monkeypatch, tmp_path, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    png = tmp_path / "x.png"
    rc, out, err = run(capsys, command, "--plot", png, "--target", tmp_path / "nowhere")
    assert rc != 0 and not png.exists() and out == ""
    assert f"--plot {png}: needs matplotlib" in err and "minispec[plot]" in err
    assert "nowhere" not in err  # said first, before a model is even looked for


def test_plots_are_titled_and_readable(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    import matplotlib.image

    from minispec.measure import crossover, sweep

    def speeds(x):
        return {m: {"tokens_per_second": 100.0 * x * (i + 1), "latency_p50_s": 0.1 * x,
                    "latency_p99_s": 0.2 * x} for i, m in enumerate(crossover.METHODS)}

    cross = {"settings": {"gamma": 4, "max_new_tokens": 8},
             "rows": [{"batch": b, **speeds(b)} for b in (1, 2, 4)]}
    served = {"settings": {"gamma": 4, "requests": 8, "slots": 4},
              "rows": [{"rate": r, **speeds(r)} for r in (1, 4)]}
    swept = {"settings": {"drafter": "model", "prompts": 2, "max_new_tokens": 8,
                          "temperature": 0.0},
             "rows": [{"gamma": g, "speedup": 1.0, "predicted_speedup": 1.5,
                       "predicted_speedup_measured_verify": 1.2} for g in (1, 2)]}
    for name, draw in [("crossover", lambda p: crossover.plot(cross, None, p)),
                       ("serve", lambda p: crossover.plot(None, served, p)),
                       ("sweep", lambda p: sweep.plot(swept, p))]:
        png = tmp_path / f"{name}.png"
        assert draw(str(png)) == f"wrote {png}"
        height, width = matplotlib.image.imread(png).shape[:2]
        assert width >= 700 and height >= 450, (name, width, height)  # was 440 x 304


@pytest.mark.parametrize("flag", ["--target", "--draft"])
def test_a_missing_model_directory_names_its_flag(pair, capsys, tmp_path, flag):
    target, draft = pair
    paths = {"--target": target, "--draft": draft, flag: tmp_path / "nope"}
    rc, _, err = run(capsys, "--target", paths["--target"], "--draft", paths["--draft"],
                     "--prompt", "x", "--device", "cpu")
    assert rc == 2 and err.startswith(f"minispec: error: {flag}: ") and "nope" in err


def test_slash_commands_take_their_words_seriously(capsys):
    from minispec.cli import command

    session = _Session()
    s = session.settings
    for line in ("/trace on", "/trace on", "/TRACE ON"):  # on means on, not a toggle
        command(session, line)
    assert s.trace is True
    command(session, "/speculative off")
    command(session, "/Speculative OFF")
    assert s.speculative is False
    command(session, "/speculative")  # no word: a toggle
    assert s.speculative is True
    assert command(session, "/quit now") is True  # refused, not a quit
    command(session, "/GAMMA 3")
    command(session, "/Gamma AUTO")
    command(session, "/seed none")
    out = capsys.readouterr().out
    assert "error: /quit takes no value, got 'now'" in out
    assert "unknown command" not in out and s.gamma == "auto" and s.seed is None
    assert command(session, "/Quit") is False


def test_length_0_is_worded_as_max_new_tokens_0(pair, capsys):
    from minispec.cli import command

    command(_Session(), "/length 0")
    repl = capsys.readouterr().out
    target, draft = pair
    _, _, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "x",
                    "--max-new-tokens", 0)
    assert repl == "error: max_new_tokens: expected an integer >= 1, got 0\n"
    assert err == "minispec: " + repl


def test_history_is_kept_in_a_file(pair, monkeypatch, tmp_path):
    readline = pytest.importorskip("readline", reason="no readline on this platform")
    from minispec.cli import HISTORY, Session, build_parser, interactive

    assert HISTORY.name == ".minispec_history"
    target, draft = pair
    history = tmp_path / "history"
    readline.clear_history()
    readline.add_history("/gamma 2")
    readline.add_history("def f(x):")
    readline.write_history_file(history)
    readline.clear_history()
    monkeypatch.setattr("sys.stdin", io.StringIO("/quit\n"))
    args = build_parser().parse_args(["--target", str(target), "--draft", str(draft),
                                      "--device", "cpu"])
    interactive(Session(args), history)
    assert readline.get_history_item(2) == "def f(x):"  # read at the start
    readline.clear_history()
    history.write_text("")
    monkeypatch.setattr("sys.stdin", io.StringIO("/quit\n"))
    readline.add_history("/trace")  # a line of this session
    interactive(Session(args), history)
    assert "/trace" in history.read_text()  # written at the end
    readline.clear_history()


def test_a_huge_gamma_is_capped_and_an_empty_prompt_said(pair, capsys):
    target, draft = pair
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "x",
                       "--gamma", 1000, "--max-new-tokens", 30, "--device", "cpu")
    assert rc == 0
    assert "note: gamma 1000 is more than the 30 new tokens to generate: capped to 29" in err
    assert "many draft calls" in err  # 29 is still a long chain
    draft_calls = int(re.search(r"(\d+) draft calls", out).group(1))
    assert draft_calls <= 30 * 29  # bounded by the cap
    rc, out, err = run(capsys, "--target", target, "--draft", draft, "--prompt", "x",
                       "--gamma", 4, "--max-new-tokens", 30, "--device", "cpu")
    assert rc == 0 and "note" not in err  # nothing to say
    rc, out, err = run(capsys, "--prompt", "", "--max-new-tokens", 3, "--device", "cpu")
    assert rc == 0 and "note: the prompt is empty: generating from the BOS token alone" in err


def test_the_no_color_trace_shows_spaces_inside_tokens():
    from minispec.cli import render_trace
    from minispec.core.speculative import Round

    pieces = {0: "file", 1: " =", 2: " self", 3: "\n"}
    r = Round(drafted=[1, 2, 0], accepted=2, token=3, kind="correction", emitted=[1, 2, 3],
              gamma=3, draft_seconds=0.0, verify_seconds=0.0, hit_eos=False)
    line = render_trace([r], lambda ids: "".join(pieces[i] for i in ids), False).splitlines()[1]
    assert line == "round   1 | ·= ·self ~file~ [->\\n]"  # was "file  =  self": unreadable
    # a tree round (more nodes than its depth): its nodes off the kept path are counted, not
    # listed as if they were the chain after the kept ones
    tree = Round(drafted=[1, 2, 0, 2, 0], accepted=2, token=3, kind="correction",
                 emitted=[1, 2, 3], gamma=3, depth=3)
    line = render_trace([tree], lambda ids: "".join(pieces[i] for i in ids), False)
    assert line.splitlines()[1] == "round   1 | ·= ·self ~3 other nodes~ [->\\n]"


def test_shipped_names_and_reports_without_machine_paths():
    from pathlib import Path

    from minispec.shipped import SHIPPED, display, resolve

    assert resolve("shipped:target") == SHIPPED / "target"
    assert resolve("weights/target") == "weights/target"  # any other path passes unchanged
    with pytest.raises(MinispecError, match="target, draft"):
        resolve("shipped:targt")
    assert display(SHIPPED / "prompts.json") == "shipped:prompts.json"
    readme = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    sweep = readme[readme.index("<!-- results: sweep"):]
    sweep = sweep[:sweep.index("<!-- /results")]
    assert "shipped:target" in sweep and not re.search(r" /[a-z]", sweep)  # no absolute path


def test_the_drafters_table_aligns_long_method_names():
    from minispec.measure.drafters import format_report

    row = {"tokens_per_target_call": 2.0, "accepted_per_round": 1.0, "drafted_per_round": 3.0,
           "ms_per_round": 9.0, "tokens_per_second": 100.0, "speedup": 1.0, "identical": True}
    rows = [{**row, "method": "model (chain)"}, {**row, "method": "eagle-2 4,3,2,2 b3 n12"}]
    text = format_report({"settings": {"prompts": 1, "max_new_tokens": 4, "gamma": 4,
                                       "repeats": 1},
                          "by_temperature": {"0": rows}, "tree_costs": []})
    table = [line for line in text.splitlines() if "1.00x" in line or "tok/call" in line]
    assert len(table) == 3
    assert len({line.index("tok/call") + 8 for line in table[:1]} |
               {line.index("2.00") + 4 for line in table[1:]}) == 1  # one right edge


@pytest.mark.parametrize("command", ["bench", "sweep", "drafters", "crossover", "serve"])
def test_measure_help_names_the_shipped_models_not_a_machine_path(command, capsys):
    from minispec.shipped import SHIPPED

    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps long help lines
    assert "shipped:target" in text
    assert str(SHIPPED) not in text


def test_load_names_only_the_shipped_models_and_points_heads_to_make_drafter():
    from minispec.shipped import NAMES, path_arg

    with pytest.raises(MinispecError) as e:
        minispec.load("shipped:nope")
    assert str(e.value).endswith("NAME one of target, draft")  # what load takes, nothing else
    for head, kind in (("medusa", "Medusa heads"), ("eagle", "an EAGLE head")):
        with pytest.raises(MinispecError, match=rf"'shipped:{head}': a head directory \({kind}\), "
                                                rf"not a model: make_drafter\('{head}', target\)"):
            minispec.load(f"shipped:{head}")
    with pytest.raises(MinispecError, match="the shipped prompt file, not a model"):
        minispec.load("shipped:prompts.json")
    assert path_arg("shipped:prompts.json").name == "prompts.json"  # the commands take them all
    assert "workloads" not in NAMES and "medusa" in NAMES


def test_a_folder_of_models_given_as_a_model_names_the_models_in_it(capsys):
    from minispec.shipped import SHIPPED

    for argv in (["--target", str(SHIPPED), "--prompt", "x"], ["bench", "--target", str(SHIPPED)],
                 ["drafters", "--target", str(SHIPPED)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{SHIPPED}/config.json: file not found ({SHIPPED} holds model directories: " \
            f"{SHIPPED / 'draft'}, {SHIPPED / 'target'}; give one of them)" in err, err


def test_the_auto_drafter_from_the_command_line(capsys):
    argv = ["--prompt", "def f(x):\n    return x\n\n\ndef g(x):\n", "--max-new-tokens", "16",
            "--no-color", "--drafter", "auto", "--gamma", "16", "--compare"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "speculative (auto drafter" in out and "outputs identical" in out
