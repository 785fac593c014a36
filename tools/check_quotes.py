"""Every quotation in the lessons, verbatim in the text it cites.

    python tools/check_quotes.py SEEDS_DIR

A lesson quotes a source text in a markdown blockquote: the quoted lines, then the citation in
parentheses at the end, then the translation in italics on its own `> *...*` line:

    # > 普通 AR：每 1 token = 1 次 target forward。 (《投机解码（Speculative Decoding）端到端深挖》§1)
    # > *Plain autoregressive decoding: one target forward for every token.*

The quote must appear in the cited text once line breaks and spaces are ignored (a lesson wraps
its lines; the texts use spaces between Chinese and Latin inconsistently), an ellipsis "……"
standing for an omission. A phrase quoted inline, in 「」, must be verbatim in one of the texts
(the sentence around it names which). The repository does not ship the texts: SEEDS_DIR holds them, one file
each, the title on its first line. Prints each quote that is not found and exits 1 if any is.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
CITATION = re.compile(r"\s*[(（](《[^》]+》)([^()（）]*)[)）]\s*$")


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def quotes(lesson: Path) -> list[tuple[int, str, str, str]]:
    """(line, quote, title, section) of every cited blockquote of a lesson."""
    found, block, start, translation = [], [], 0, False
    lines = lesson.read_text(encoding="utf-8").splitlines() + [""]
    for i, line in enumerate(lines, 1):
        m = re.match(r"# > ?(.*)$", line)
        if m and (translation or m.group(1).startswith("*")):  # the translation, to its closing *
            translation = not m.group(1).rstrip().endswith("*") or m.group(1).strip() == "*"
        elif m:
            start = start or i
            block.append(m.group(1))
            cited = CITATION.search(m.group(1))
            if cited:
                block[-1] = m.group(1)[:cited.start()]
                found.append((start, " ".join(block), cited.group(1), cited.group(2).strip()))
                block, start = [], 0
        else:
            block, start, translation = [], 0, False
    return found


def texts(seeds: Path) -> dict[str, str]:
    """Title (《first line》) -> the text, squeezed."""
    out = {}
    for path in sorted(seeds.glob("*.txt")):
        body = path.read_text(encoding="utf-8")
        out[f"《{body.splitlines()[0].rstrip('#').strip()}》"] = squeeze(body)
    return out


def missing(seeds: Path, lessons: Path = LESSONS) -> list[str]:
    sources, bad = texts(seeds), []
    for lesson in sorted(lessons.glob("[0-9][0-9]_*.py")):
        for line, quote, title, section in quotes(lesson):
            text = sources.get(title)
            if text is None:
                bad.append(f"{lesson.name}:{line}: cites {title}, not one of {', '.join(sources)}")
                continue
            at = 0
            for piece in filter(None, (squeeze(p) for p in re.split(r"……|\.\.\.", quote))):
                at = text.find(piece, at)
                if at < 0:
                    bad.append(f"{lesson.name}:{line}: not in {title}: {quote}")
                    break
                at += len(piece)
        text = lesson.read_text(encoding="utf-8")
        for m in re.finditer(r"「([^」]+)」", text):  # a phrase quoted inline, its text named beside it
            if not any(squeeze(m.group(1)) in body for body in sources.values()):
                bad.append(f"{lesson.name}:{text.count(chr(10), 0, m.start()) + 1}: in none of the texts: {m.group(1)}")
    return bad


def main() -> int:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("usage: python tools/check_quotes.py SEEDS_DIR", file=sys.stderr)
        return 2
    bad = missing(Path(sys.argv[1]))
    print("\n".join(bad) if bad else "every quotation is verbatim in its source")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
