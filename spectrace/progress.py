"""The command line's status line on stderr, and a run started in a child whose status comes up a
pipe as lines (the live walkthrough, viz/tui/live.py, shows them)."""
from __future__ import annotations

import os
import subprocess
import sys

STATUS_ENV = "SPECTRACE_STATUS_LINES"  # set by the live walkthrough (viz/tui/live.py) for the run it starts
STATUS = "status: "  # ... whose status then comes as lines of stderr, each starting so
WRITTEN = "trace written"  # a run's last status: its trace is whole (the process may take a while to exit)


def on_a_terminal() -> bool:
    """Whether the walkthrough can be drawn: Textual reads keys from stdin and draws through stderr
    (sys.__stderr__); stdout is where a run's summary goes."""
    return sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()


class Progress:
    """One status line on stderr while a run loads and generates; silent when stderr is not a
    terminal, one line a message for the live walkthrough."""

    def __init__(self, total_tokens: int):
        self.lines = bool(os.environ.get(STATUS_ENV))
        self.live, self.total, self.tokens = sys.stderr.isatty() or self.lines, total_tokens, 0

    def say(self, message: str | None) -> None:
        """Show `message` on the status line; None clears it (before a table row prints)."""
        if self.lines:
            if message:
                print(STATUS + message, file=sys.stderr, flush=True)
        elif self.live:
            print("\r\x1b[K" + (f"spectrace: {message}" if message else ""), end="", file=sys.stderr, flush=True)

    def step(self, record: dict) -> None:
        self.tokens += len(record["committed_tokens"])
        self.say(f"generating: {self.tokens} of at most {self.total} tokens")

    def done(self) -> None:
        if self.live and not self.lines:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def start_run(argv: list[str], trace_path: str) -> subprocess.Popen:
    """`spectrace ARGV` (a run) in a child writing `trace_path`: its status lines and errors on its
    stderr, its summary on its stdout (text pipes). Started before the walkthrough imports Textual,
    so torch loads on the other core meanwhile."""
    return subprocess.Popen([sys.executable, "-m", "spectrace", *argv, "--no-tui", "--trace", trace_path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, STATUS_ENV: "1"})
