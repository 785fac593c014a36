"""The walkthrough of a trace whose steps take a moment to open: a fast run's, which keeps them as
frames that are built into records when read, and building needs torch (about 2 s to import on
a small machine). The app is up at once, its phase bar saying what it is doing; a thread opens
the trace and its first step, and the app shows them. What stops the opening closes the app and
is the command's one line.

    spectrace replay FAST.jsonl              (cli_view.cmd_replay: FAST.jsonl.frames beside it)
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual.widgets import Static

from spectrace.core.trace import TraceError
from spectrace.core.trace_reader import TraceFile
from spectrace.errors import SpectraceError
from spectrace.progress import on_a_terminal
from spectrace.viz.tui.app import HELP, Panel, Walkthrough, check_opens


class Opening(Walkthrough):
    """The walkthrough before its trace: `open_trace` runs on a thread of its own."""

    def __init__(self, open_trace: Callable[[], TraceFile], what: str):
        super().__init__(None)
        self.open_trace, self.what = open_trace, what
        self.problem: str | None = None  # why the trace could not be shown

    def on_mount(self) -> None:
        self.query_one("#phases", Static).update(Text(self.what, style="bold cyan"))
        self.query_one("#tree", Panel).show(Text.from_markup(HELP.rsplit("\n", 1)[0]), "while it opens")
        threading.Thread(target=self.load, daemon=True).start()

    def load(self) -> None:
        try:
            trace = self.open_trace()
            check_opens(trace)  # its first step built here, not on the app's thread
        except (TraceError, SpectraceError) as e:
            self.problem = str(e)
            self.tell(self.exit)
            return
        self.tell(self.show, trace)

    def tell(self, method, *args) -> None:
        """Call `method` on the app's thread, unless the app has closed (quit while it opened)."""
        with contextlib.suppress(RuntimeError):
            self.call_from_thread(method, *args)

    def show(self, trace: TraceFile) -> None:
        self.take(trace)
        self.opened()


def replay_opening(path: str | Path, open_trace: Callable[[], TraceFile]) -> None:
    """The walkthrough of the trace at `path`, opened by `open_trace` behind its first screen;
    its lines are read first, so a file that is no trace is refused before the app starts."""
    TraceFile(path)
    if not on_a_terminal():
        raise SpectraceError("the walkthrough needs a terminal on stdin, stdout and stderr (it draws through "
                             f"stderr); without one, draw a step with: spectrace render {path} --step N -o tree.svg")
    app = Opening(open_trace, f"opening {Path(path).name}: building its steps from its frames")
    app.run()
    if app.return_code:  # Textual has drawn what went wrong; the command fails with it
        raise SpectraceError(f"the walkthrough stopped on an error (exit code {app.return_code})")
    if app.problem is not None:
        raise TraceError(app.problem)
