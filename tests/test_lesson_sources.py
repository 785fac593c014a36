"""The lessons' quotations are verbatim in the texts they cite (tools/check_quotes.py), and no
lesson points at a path outside the repository. The texts are not in the repository: the check
against them runs where they are (SPECTRACE_SEEDS, or ../shared/seeds beside the checkout); the
checker itself is tested on texts made here."""
import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_quotes, coverage = tool("check_quotes"), tool("coverage")
SEEDS = Path(os.environ.get("SPECTRACE_SEEDS", ROOT.parent / "shared" / "seeds"))


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the source texts are not on this machine")
def test_every_lesson_quotation_is_verbatim_in_its_source():
    assert check_quotes.missing(SEEDS) == []


def test_the_quote_checker_finds_what_is_not_verbatim(tmp_path):
    seeds, lessons = tmp_path / "seeds", tmp_path / "lessons"
    seeds.mkdir(), lessons.mkdir()
    (seeds / "000.txt").write_text("一篇文章\n\n1. 第一节\n\nDraft（便宜）猜候选，\nVerify 一次验整块。\n", encoding="utf-8")
    (lessons / "01_a.py").write_text(
        "# > Draft（便宜）猜候选，Verify 一次验整块。 (《一篇文章》§1)\n# > *translation, not checked*\n"
        "# > Draft……验整块。 (《一篇文章》§1)\n"
        "# > Draft 猜候选 (《一篇文章》§1)\n"
        "# > 猜候选 (《另一篇》§2)\n"
        "# The text calls it 「验整块」, not 「验一块」.\n", encoding="utf-8")
    bad = check_quotes.missing(seeds, lessons)
    assert [re.match(r"01_a.py:(\d+)", b).group(1) for b in bad] == ["4", "5", "6"], bad


def test_no_lesson_points_outside_the_repository():
    for path in sorted((ROOT / "lessons").iterdir()):
        if path.suffix in (".py", ".md"):
            assert not re.search(r"\.\./shared|/seeds/|/work/", path.read_text(encoding="utf-8")), path.name


def test_a_lesson_teaches_what_its_header_claims_and_the_readme_says_so():
    """Every section a lesson's header names is cited in its body, every section its body cites
    is in its header, and lessons/README.md's coverage table is the one these make."""
    for lesson in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")):
        claimed, cited = coverage.claimed(lesson), coverage.cited_in_body(lesson)
        assert claimed == cited, (lesson.name, sorted(claimed - cited), sorted(cited - claimed))
    assert coverage.markdown() in (ROOT / "lessons" / "README.md").read_text(encoding="utf-8")


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the source texts are not on this machine")
def test_every_section_a_lesson_claims_is_a_section_of_its_text():
    texts = {path.name[:3]: path.read_text(encoding="utf-8") for path in SEEDS.glob("*.txt")}
    for (text, section), lessons in coverage.table().items():
        if text == "004":  # unnumbered headings: the opening, then nine
            assert 0 <= int(section) <= 9, (section, lessons)
        else:
            assert re.search(rf"^{re.escape(section)}\.? \S", texts[text], re.M), (text, section, lessons)
