"""The command line's status line on stderr."""
from __future__ import annotations

import sys


class Progress:
    """One status line on stderr while a run loads and generates (the walkthrough opens only
    when it is done); silent when stderr is not a terminal."""

    def __init__(self, total_tokens: int):
        self.live, self.total, self.tokens = sys.stderr.isatty(), total_tokens, 0

    def say(self, message: str | None) -> None:
        """Show `message` on the status line; None clears it (before a table row prints)."""
        if self.live:
            print("\r\x1b[K" + (f"spectrace: {message}" if message else ""), end="", file=sys.stderr, flush=True)

    def step(self, record: dict) -> None:
        self.tokens += len(record["committed_tokens"])
        self.say(f"generating: {self.tokens} of at most {self.total} tokens")

    def done(self) -> None:
        if self.live:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
