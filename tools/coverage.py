"""Which sections of the three texts each lesson teaches, from the lessons themselves.

    python tools/coverage.py          prints the course README's coverage table

A lesson names the sections it teaches in its header ("**Chapter sections.**", by the texts'
short names `000`, `002`, `004`); tests/test_lesson_sources.py checks that the README's table is
this one, and that every section a header claims is taught in the lesson's body too (cited
there, as "000 §7.2", "(002 §12.6.4)" or a quotation's 《title》§7.2).
"""
from __future__ import annotations

import re
from pathlib import Path

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
TITLES = {"000": "投机解码（Speculative Decoding）端到端深挖", "002": "第12章 投机解码：以小博大", "004": "Speculative Decoding"}
SECTION = r"§(\d+(?:\.\d+)*)"


def header_and_body(lesson: Path) -> tuple[str, str]:
    text = lesson.read_text(encoding="utf-8")
    m = re.search(r"\*\*Chapter sections\.\*\*(.*?)\n#\n", text, re.S)
    return (m.group(1), text[:m.start()] + text[m.end():]) if m else ("", text)


def claimed(lesson: Path) -> set[tuple[str, str]]:
    """(text, section) pairs the header names: each section belongs to the text named before it."""
    header, out, text = header_and_body(lesson)[0], set(), None
    for token in re.finditer(r"`(00[024])`|" + SECTION, header):
        if token.group(1):
            text = token.group(1)
        else:
            out.add((text, token.group(2)))
    return out


def cited_in_body(lesson: Path) -> set[tuple[str, str]]:
    body, out = header_and_body(lesson)[1], set()
    for m in re.finditer(r"\b(00[024])\)?\s*((?:" + SECTION + r"(?:\s*[-,]\s*|\s*and\s*)?)+)", body):
        out |= {(m.group(1), s) for s in re.findall(SECTION, m.group(2))}
    for key, title in TITLES.items():
        out |= {(key, s) for s in re.findall(f"《{re.escape(title)}》{SECTION}", body)}
    return out


def table() -> dict[tuple[str, str], list[str]]:
    cover: dict[tuple[str, str], list[str]] = {}
    for lesson in sorted(LESSONS.glob("[0-9][0-9]_*.py")):
        for key in claimed(lesson):
            cover.setdefault(key, []).append(lesson.name[:2])
    return cover


def section_key(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split("."))


def markdown() -> str:
    cover, rows = table(), []
    for key, name in (("000", "SGLang end to end"), ("002", "vLLM's chapter 12"), ("004", "the ModelRunner section")):
        cells = [f"§{s}→{', '.join(cover[key, s])}" for s in sorted((s for k, s in cover if k == key), key=section_key)]
        rows.append(f"| `{key}` ({name}) | {'; '.join(cells)} |")
    return "| text | section → lessons |\n|---|---|\n" + "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
