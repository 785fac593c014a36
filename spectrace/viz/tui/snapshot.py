"""The walkthrough's screen after some keys, without a terminal: for lessons (text in a terminal,
SVG in a notebook) and for the tests that drive the walkthrough with Textual's Pilot.

    snapshot(trace, keys=["right", "]"], size=(120, 40))           the screen as plain text
    snapshot(trace, keys, size, svg=True)                          the screen as an SVG document
    text_and_svg(trace, keys, size)                                both, from one drive
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import io
from pathlib import Path

from rich.console import Console

from spectrace.traces import open_trace
from spectrace.viz.tui.app import Walkthrough


def screen_text(app) -> str:
    """The screen as plain text, as Textual's own screenshot export composes it."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def drive(trace: str | Path, keys=(), size=(100, 30), export_dir=None, svg: bool | None = False):
    """Open the walkthrough on `trace`, press `keys`, return (app, screen): the screen as text,
    as SVG with svg=True, or as both (a pair) with svg=None ("" if a key quit the app).
    `app.top_screen` keeps the screen on top at the end, read before the app shuts down."""
    async def go():
        app = Walkthrough(open_trace(trace), export_dir=export_dir)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for k in keys:
                await pilot.press(k)
                await pilot.pause()
            app.top_screen = app.screen if app.is_running else None
            if not app.is_running:
                return app, ""
            if svg is None:
                return app, (screen_text(app), app.export_screenshot())
            return app, app.export_screenshot() if svg else screen_text(app)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here: run one
        return asyncio.run(go())
    # called from a running loop (a Jupyter cell): asyncio.run refuses it there, so a thread runs ours
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def snapshot(trace: str | Path, keys=(), size=(100, 30), svg: bool = False) -> str:
    """The walkthrough's screen after `keys` (Textual key names: "right", "left_square_bracket",
    "down", ...), as text or as SVG."""
    return drive(trace, keys, size, svg=svg)[1]


def text_and_svg(trace: str | Path, keys=(), size=(100, 30)) -> tuple[str, str]:
    """The walkthrough's screen after `keys`, as text and as SVG, from one drive."""
    return drive(trace, keys, size, svg=None)[1]
