"""python -m minispec.measure.readme: results blocks are found with their commands in README.md,
docs/*.md and weights/README.md, rewritten with the command's output, and only the ones asked
for."""

import pytest

from minispec.measure.readme import ROOT, blocks, default_files, find, main, regenerate, rewrite

TEXT = """intro
<!-- results: one: python -c "print(1)" -->
```
old one
```
<!-- /results -->
middle
<!-- results: two: python -m minispec bench -->
```
old two
```
<!-- /results -->
end
"""

OTHER = """a page
<!-- results: three: python -m minispec sweep -->
```
old three
```
<!-- /results -->
"""


def test_blocks_are_found_and_only_the_chosen_ones_rewritten():
    assert blocks(TEXT) == [("one", 'python -c "print(1)"'), ("two", "python -m minispec bench")]
    out = rewrite(TEXT, {"one"}, runner=lambda cmd: f"ran {cmd}")
    assert 'ran python -c "print(1)"' in out and "old one" not in out
    assert "old two" in out and out.startswith("intro") and out.endswith("end\n")
    assert blocks(out) == blocks(TEXT)  # rewriting keeps the blocks rewritable


def test_the_default_files_are_the_readme_the_docs_and_the_weights_readme(tmp_path):
    for name in ("README.md", "docs/b.md", "docs/a.md", "docs/notes.txt", "weights/README.md"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("text\n")
    assert [p.relative_to(tmp_path).as_posix() for p in default_files(tmp_path)] == [
        "README.md", "docs/a.md", "docs/b.md", "weights/README.md"]


def test_a_block_is_found_by_name_in_whichever_file_holds_it(tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text(TEXT)
    b.write_text(OTHER)
    assert [(p.name, n) for p, n, _ in find([a, b])] == [("a.md", "one"), ("a.md", "two"),
                                                         ("b.md", "three")]
    written = regenerate([a, b], {"three"}, runner=lambda cmd: f"ran {cmd}")
    assert written == [b]  # a.md has no block asked for: not rewritten
    assert a.read_text() == TEXT and "ran python -m minispec sweep" in b.read_text()
    regenerate([a, b], None, runner=lambda cmd: "new")  # no --only: every block of every file
    assert "old" not in a.read_text() + b.read_text()


def test_a_name_used_in_two_files_is_refused(tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text(TEXT)
    b.write_text(TEXT.replace("one", "other"))  # "two" in both
    with pytest.raises(ValueError, match="'two' is in .*a.md and in .*b.md"):
        find([a, b])


def test_every_results_block_of_the_readme_docs_and_weights_readme_names_a_command():
    found = find(default_files())  # raises if a name repeats across the files
    names = {name: path.relative_to(ROOT).as_posix() for path, name, _ in found}
    assert {"drafters", "bench", "sweep", "crossover", "serve", "real-bench", "real-drafters",
            "real-judge", "evaluate"} <= set(names)
    assert names["evaluate"] == "weights/README.md" and names["crossover"].startswith("docs/")
    for path, name, cmd in found:
        assert cmd.startswith("python "), f"{path}: block {name} names no command: {cmd!r}"


def test_list_shows_the_file_of_each_block(capsys):
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "weights/README.md: evaluate: python weights/evaluate.py" in "\n".join(lines)
    assert any(line.startswith("docs/batches.md: crossover: python -m minispec crossover")
               for line in lines)


def test_an_unknown_block_is_an_error_and_rewrites_nothing(capsys):
    assert main(["--only", "no-such-block"]) == 2
    assert "no block named no-such-block" in capsys.readouterr().err
