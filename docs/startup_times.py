"""How long the command line keeps a user waiting, from a fresh process, in a pseudo-terminal of
80x24 (the walkthrough draws only on a terminal):

    spectrace run --max-new-tokens 0            until the one-line refusal (a bad number)
    spectrace run --algo eagle --topk 4         until the first status line, and the walkthrough's
                                                first screen (its DRAFT phase drawn)
    spectrace replay TRACE                      until the first screen

    python docs/startup_times.py [--runs 5]

Prints each measure's median and worst over the runs (docs/install.md's table).
"""
from __future__ import annotations

import argparse
import fcntl
import os
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time


def in_a_terminal(args: list[str], until: bytes | None, timeout: float = 60.0) -> tuple[float, float | None]:
    """Runs `spectrace ARGS` with a pseudo-terminal of 80x24 on stdin, stdout and stderr: seconds
    to its first byte, and to the first output holding `until` (then `q` quits it), or to its exit."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "spectrace", *args], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color"}, close_fds=True)
    os.close(slave)
    seen, first, found, quit_sent = b"", None, None, False
    while proc.poll() is None and time.perf_counter() - t0 < timeout:
        ready, _, _ = select.select([master], [], [], 0.02)
        if ready:  # keep reading: a full terminal would block the app
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:
                break
            first = first if first is not None else time.perf_counter() - t0
            seen = (seen + chunk)[-1 << 16:]
            if until is not None and found is None and until in seen:
                found = time.perf_counter() - t0
        if found is not None and not quit_sent and time.perf_counter() - t0 > found + 0.5:
            os.write(master, b"q")
            quit_sent = True
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    os.close(master)
    return first, found if until is not None else time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.jsonl")
        for _ in range(runs):
            rows.setdefault("run --max-new-tokens 0: the refusal", []).append(
                in_a_terminal(["run", "--max-new-tokens", "0"], None)[1])
            first, screen = in_a_terminal(["run", "--algo", "eagle", "--topk", "4", "--trace", trace], b"DRAFT")
            rows.setdefault("run --algo eagle --topk 4: first status line", []).append(first)
            rows.setdefault("run --algo eagle --topk 4: first screen", []).append(screen)
            rows.setdefault("replay TRACE: first screen", []).append(in_a_terminal(["replay", trace], b"DRAFT")[1])
    print(f"{'':<48} {'median s':>9} {'worst s':>8}   ({runs} runs, {os.cpu_count()} cores)")
    for name, times in rows.items():
        ok = [t for t in times if t is not None]
        print(f"{name:<48} {statistics.median(ok):>9.2f} {max(ok):>8.2f}" if ok else f"{name:<48} not seen")


if __name__ == "__main__":
    main()
