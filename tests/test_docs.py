"""The README and docs/ hold together: every relative link reaches a file (and a heading, where it
names one), and the README's quick-start command runs as written (with a short output)."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "lessons" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target} (no such heading)"


def test_readme_quick_start_runs(tmp_path):
    blocks = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    command = blocks[0].split("&&")[-1].strip()  # after the install: the run itself
    args = shlex.split(command)
    assert args[:2] == ["spectrace", "run"], command
    done = subprocess.run([sys.executable, "-m", "spectrace", *args[1:], "--no-tui", "--max-new-tokens", "8",
                           "--trace", str(tmp_path / "t.jsonl")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "t.jsonl").stat().st_size > 0


@pytest.mark.parametrize("command", ["run", "replay", "render", "export", "rejudge", "report", "bench", "tune"])
def test_every_flag_of_every_command_is_documented(command):
    from spectrace.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == command)[1]
    docs = (ROOT / "docs" / "cli.md").read_text() + (ROOT / "docs" / "walkthrough.md").read_text()
    flags = {s for a in sub._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    assert not sorted(f for f in flags if f not in docs)
