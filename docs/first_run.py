"""How long a new user waits for the headline command on the CPU, from a fresh process (imports,
model loading, generation, trace), idle and with every core kept busy by another process:

    spectrace run --algo eagle --topk 4 --no-tui --max-new-tokens 128

    python docs/first_run.py [--runs 5]

Prints each run's wall time, the median and the worst, idle and busy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = ["run", "--algo", "eagle", "--topk", "4", "--no-tui", "--max-new-tokens", "128"]


def timed_runs(runs: int, trace_dir: str) -> list[float]:
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "spectrace.cli", *COMMAND, "--trace", f"{trace_dir}/{i}.jsonl"],
                       check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def report(label: str, times: list[float]) -> None:
    print(f"{label:<28} " + "  ".join(f"{t:.2f}" for t in times) +
          f"   median {statistics.median(times):.2f} s, worst {max(times):.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python docs/first_run.py")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(f"spectrace {' '.join(COMMAND)}   ({cores} cores)")
    with tempfile.TemporaryDirectory() as tmp:
        idle = timed_runs(args.runs, tmp)
        report("idle", idle)
        neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
        try:
            busy = timed_runs(args.runs, tmp)
        finally:
            for p in neighbours:
                p.kill()
        report(f"{cores} busy-looping neighbours", busy)
    print(f"busy / idle (medians): {statistics.median(busy) / statistics.median(idle):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
