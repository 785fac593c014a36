"""How long the command line keeps a user waiting, from a fresh process, in a pseudo-terminal of
80x24 (the walkthrough draws only on a terminal):

    spectrace run --max-new-tokens 0            until the one-line refusal (a bad number)
    spectrace run --algo eagle --topk 4         until the first status line, the walkthrough's
                                                screen while the run loads, and the run's first
                                                step drawn (its DRAFT phase)
    spectrace replay TRACE                      until the first step drawn (the explicit run's
                                                trace; and a fast run's, whose steps are frames
                                                built when read, which needs torch: until its
                                                app is up, and until its first step is drawn)

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


def in_a_terminal(args: list[str], marks: tuple[bytes, ...] = (), timeout: float = 60.0):
    """Runs `spectrace ARGS` with a pseudo-terminal of 80x24 on stdin, stdout and stderr; `q` once
    every mark has been drawn. Returns (seconds to its first byte, {mark: seconds to the first
    output holding it}, seconds to its exit, exit code, everything it wrote)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "spectrace", *args], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color"}, close_fds=True)
    os.close(slave)
    out, first, found, quit_sent = b"", None, {}, False
    while time.perf_counter() - t0 < timeout:
        ready, _, _ = select.select([master], [], [], 0.02)
        if ready:  # keep reading: a full terminal would block the app
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the process has closed the terminal
                break
            first = first if first is not None else time.perf_counter() - t0
            out += chunk
            found.update({m: time.perf_counter() - t0 for m in marks if m not in found and m in out[-(1 << 16):]})
        elif proc.poll() is not None:
            break
        if marks and len(found) == len(marks) and not quit_sent and time.perf_counter() - t0 > max(found.values()) + .5:
            os.write(master, b"q")
            quit_sent = True
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    os.close(master)
    return first, found, time.perf_counter() - t0, code, out.decode(errors="replace")


UP, OPENING, DRAWN = b"while the run loads", b"while it opens", "tree · DRAFT".encode()  # the app's first screen; the trace's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace, fast = os.path.join(tmp, "t.jsonl"), os.path.join(tmp, "fast.jsonl")
        subprocess.run([sys.executable, "-m", "spectrace", "run", "--backend", "fast", "--algo", "eagle",
                        "--topk", "4", "--no-tui", "--trace", fast], check=True, capture_output=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
        for _ in range(runs):
            rows.setdefault("run --max-new-tokens 0: the refusal", []).append(
                in_a_terminal(["run", "--max-new-tokens", "0"])[2])
            first, found, *_ = in_a_terminal(["run", "--algo", "eagle", "--topk", "4", "--trace", trace], (UP, DRAWN))
            rows.setdefault("run --algo eagle --topk 4: first status line", []).append(first)
            rows.setdefault("run --algo eagle --topk 4: the walkthrough, loading", []).append(found.get(UP))
            rows.setdefault("run --algo eagle --topk 4: the first step drawn", []).append(found.get(DRAWN))
            replayed = in_a_terminal(["replay", trace], (DRAWN,))[1]
            rows.setdefault("replay TRACE: first screen", []).append(replayed.get(DRAWN))
            replayed = in_a_terminal(["replay", fast], (OPENING, DRAWN))[1]
            rows.setdefault("replay a fast run's TRACE: the app up, opening it", []).append(replayed.get(OPENING))
            rows.setdefault("replay a fast run's TRACE: first step drawn", []).append(replayed.get(DRAWN))
    print(f"{'':<52} {'median s':>9} {'worst s':>8}   ({runs} runs, {os.cpu_count()} cores)")
    for name, times in rows.items():
        ok = [t for t in times if t is not None]
        print(f"{name:<52} {statistics.median(ok):>9.2f} {max(ok):>8.2f}" if ok else f"{name:<52} not seen")


if __name__ == "__main__":
    main()
