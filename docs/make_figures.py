"""Make the README's figures from the committed trace tests/data/walkthrough.jsonl:

    python docs/make_figures.py        # writes docs/tui.png and docs/tree.png

docs/tree.png is `spectrace render`'s own output. docs/tui.png is Textual's SVG screenshot of the
walkthrough at 110x32, turned into PNG by `rsvg-convert` (Debian's librsvg2-bin), needed only here.
"""
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile
from spectrace.viz.tui.app import Walkthrough

DOCS = Path(__file__).parent
TRACE = DOCS.parent / "tests" / "data" / "walkthrough.jsonl"
STEP = 2  # a step whose tree has correct, rejected and unreached nodes


async def screenshot() -> str:
    app = Walkthrough(TraceFile(TRACE))
    async with app.run_test(size=(110, 32)) as pilot:
        await pilot.press(*["right"] * STEP, "down", "down")
        await pilot.pause()
        return app.export_screenshot(title="spectrace replay")


def run() -> int:
    if shutil.which("rsvg-convert") is None:
        print("make_figures: needs rsvg-convert (Debian: apt install librsvg2-bin) to turn the screen into PNG",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:  # the screen's SVG never lands in docs/
        svg = Path(tmp) / "tui.svg"
        svg.write_text(asyncio.run(screenshot()), encoding="utf-8")
        subprocess.run(["rsvg-convert", "-z", "1.5", "-o", str(DOCS / "tui.png"), str(svg)], check=True)
    step = TraceFile(TRACE).step(STEP)["step"]
    return main(["render", str(TRACE), "--step", str(step), "--request", "0", "-o", str(DOCS / "tree.png")])


if __name__ == "__main__":
    sys.exit(run())
