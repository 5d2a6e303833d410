"""README.md is a map (<= 250 lines, with a "Read the code" section, the set-up lines CI reads,
the suite's command once); README.md and docs/*.md link only to files that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def sections(text: str) -> dict[str, str]:
    """'## Heading' -> the text under it, up to the next '## '."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_readme_is_a_map():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    read = sections(text)["Read the code"]
    order = ["minispec/core/model.py", "minispec/core/sampling.py", "minispec/core/verify.py",
             "minispec/core/drafter.py", "minispec/core/speculative.py", "tests/test_verify.py"]
    assert [read.index(f"[{path}]") for path in order] == sorted(read.index(f"[{path}]")
                                                                  for path in order)
    assert "## What else is here" in text


def test_the_line_numbers_of_read_the_code_hold_what_they_name():
    # "`name` (lines a-b)" or "`name` (a-b)" after a file's link: that file's def or class of that
    # name spans exactly lines a-b (so the map is redone when the code moves)
    import ast

    read = sections(README.read_text())["Read the code"]
    checked = 0
    for item in re.split(r"\n\d+\. ", read)[1:]:
        path = ROOT / re.search(r"\[([^\]]+\.py)\]", item).group(1)
        spans = {n.name: (n.lineno, n.end_lineno) for n in ast.parse(path.read_text()).body
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for name, a, b in re.findall(r"`(\w+)`\s+\((?:lines\s+)?(\d+)-(\d+)", item):
            assert spans.get(name) == (int(a), int(b)), (path.name, name, spans.get(name))
            checked += 1
    assert checked == 16  # every one the map names


def test_the_setup_block_holds_the_two_lines_ci_runs_and_the_suite_runs_from_one_place():
    setup = sections(README.read_text())["Set up, run, test"]
    first = re.search(r"^```bash\n(.*?)^```", setup, re.S | re.M).group(1)  # as .ci/run reads it
    lines = [line for line in first.splitlines() if line.strip()]
    assert len(lines) == 2 and "python -m pytest" in lines[1], lines
    everywhere = "".join(page.read_text() for page in PAGES)
    assert everywhere.count("python -m pytest") == 1  # the second set-up line, nowhere else


def test_every_relative_link_of_the_readme_and_docs_points_at_a_file():
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_docs_page_links_back_to_the_readme_and_is_linked_from_it():
    readme = README.read_text()
    for page in PAGES[1:]:
        assert "](../README.md)" in page.read_text(), page.name
        assert f"](docs/{page.name})" in readme, f"README.md does not link to docs/{page.name}"
