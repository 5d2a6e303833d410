"""python -m minispec.measure.readme: results blocks are found with their commands, rewritten
with the command's output, and only the ones asked for."""

from pathlib import Path

from minispec.measure.readme import blocks, rewrite

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


def test_blocks_are_found_and_only_the_chosen_ones_rewritten():
    assert blocks(TEXT) == [("one", 'python -c "print(1)"'), ("two", "python -m minispec bench")]
    out = rewrite(TEXT, {"one"}, runner=lambda cmd: f"ran {cmd}")
    assert 'ran python -c "print(1)"' in out and "old one" not in out
    assert "old two" in out and out.startswith("intro") and out.endswith("end\n")
    assert blocks(out) == blocks(TEXT)  # rewriting keeps the blocks rewritable


def test_the_readme_names_a_command_for_each_block():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = dict(blocks(readme))
    assert {"crossover", "serve"} <= set(found)
    assert all(cmd.startswith("python ") for cmd in found.values())
