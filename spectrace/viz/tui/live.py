"""The walkthrough of a run still going: `spectrace run` on a terminal draws the app at once and runs
the models in a child process (`spectrace run … --no-tui`), so the screen is up while torch loads on
another core. The child's status lines come up a pipe into the app's phase bar; when the run ends,
its trace opens in the same app. The run's summary and errors print after the app closes, as a run
without the walkthrough prints them.

    spectrace run --algo eagle --topk 4      (cli.cmd_run: progress.start_run, then walk_a_live_run)
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading

from rich.text import Text
from textual.widgets import Static

from spectrace.core.trace import TraceError
from spectrace.errors import SpectraceError
from spectrace.progress import STATUS, WRITTEN
from spectrace.traces import open_trace
from spectrace.viz.tui.app import HELP, Panel, Walkthrough, check_opens


class LiveWalkthrough(Walkthrough):
    """The walkthrough, open before its trace exists: the phase bar says what the run is doing, the
    tree panel explains the phases; `take` shows the trace once the child has written it."""

    def __init__(self, child: subprocess.Popen, trace_path: str, command: str):
        super().__init__(None)
        self.child, self.trace_path, self.command = child, trace_path, command
        self.said: list[str] = []  # the child's stderr lines that are not status: errors, warnings
        self.problem: str | None = None  # why the trace could not be shown
        self.written = False  # the child has said its trace is whole
        self.follower = threading.Thread(target=self.follow, daemon=True)

    def on_mount(self) -> None:
        self.query_one("#title", Static).update(Text(f"spectrace  {self.command}", style="bold"))
        self.status("starting the run")
        self.query_one("#tree", Panel).show(Text.from_markup(HELP.rsplit("\n", 1)[0]), "while the run loads")
        self.follower.start()

    def status(self, message: str) -> None:
        if self.trace is None:  # the phase bar, until there are phases to show
            self.query_one("#phases", Static).update(Text(f"run: {message}", style="bold cyan"))

    def tell(self, method, *args) -> None:
        """Call `method` on the app's thread, unless the app has closed (quit while the run goes)."""
        with contextlib.suppress(RuntimeError):  # raised where there is no event loop any more
            self.call_from_thread(method, *args)

    def follow(self) -> None:
        """A thread of its own: relay the child's status; open its trace at its first steps and again
        once written (the child's exit, torch's teardown, takes a while more); keep its other lines.
        Whatever stops it closes the app with a line, rather than leaving it loading for ever."""
        try:
            self.relay()
        except Exception as e:  # noqa: BLE001 (a bug here must not hang the app)
            self.problem = f"the walkthrough stopped following the run: {e!r}"
            self.tell(self.exit)

    def relay(self) -> None:
        early = False
        for line in self.child.stderr:
            message = line[len(STATUS):].rstrip("\n")
            if not line.startswith(STATUS):
                self.said.append(line)
            elif message == WRITTEN:
                self.written = True
                self.open_written(whole=True)
            else:
                self.tell(self.status, message)
                if not early and message.startswith("generating:"):  # a step is done: show what is there
                    early = self.open_written(whole=False)
        if self.child.wait() != 0:  # the child's own lines say why, once the app has closed
            self.tell(self.exit)

    def open_written(self, whole: bool) -> bool:
        """Show the trace as far as written; a trace that cannot open yet waits, unless whole."""
        try:
            trace = open_trace(self.trace_path)
            check_opens(trace)
        except (TraceError, SpectraceError) as e:
            if whole:
                self.problem = str(e)
                self.tell(self.exit)
            return False
        self.tell(self.show, trace, whole)
        return True

    def show(self, trace, whole: bool) -> None:
        """The first steps, at DRAFT 1; then the whole trace, where the reader is."""
        if self.trace is None:
            self.take(trace)
            self.opened(whole)
            if not whole:
                self.notify("the run goes on: its later steps come when it ends", title="run", timeout=4)
            return
        cursor = self.request, self.position, self.phase_name, self.node
        self.take(trace)
        self.request, self.position, self.phase_name, self.node = cursor  # the trace only grew
        self.opened(True)


def walk_a_live_run(child: subprocess.Popen, trace_path: str, command: str) -> int:
    """The walkthrough of `child` (progress.start_run) writing `trace_path`: the child's exit code,
    or 2 where its trace cannot be shown."""
    app = LiveWalkthrough(child, trace_path, command)
    try:
        app.run()
    finally:
        if child.poll() is None and not app.written:  # quit while the run goes: it stops as on Ctrl-C,
            child.send_signal(signal.SIGINT)  # its steps so far kept
        summary = child.stdout.read()
        code = child.wait()
        if app.follower.is_alive():
            app.follower.join()  # the last lines the child wrote
    # back from the alternate screen, the cursor is where the status line left it: clear that row,
    # so the summary starts on it rather than after "opening the walkthrough"
    sys.stderr.write("\r\x1b[K")
    sys.stderr.flush()
    sys.stdout.write(summary)
    sys.stderr.writelines(app.said)
    if app.return_code:  # Textual has drawn what went wrong; the command fails with it
        raise SpectraceError(f"the walkthrough stopped on an error (exit code {app.return_code})")
    if app.problem is not None:
        raise TraceError(app.problem)
    return code if code >= 0 else 128 - code  # a child ended by a signal, as a shell reports it
