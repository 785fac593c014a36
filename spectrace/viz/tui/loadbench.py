"""How fast a large trace opens in the walkthrough: a benchmark that prints numbers.

    python -m spectrace.viz.tui.loadbench TRACE [--steps 10000]

Repeats TRACE's step records until the file holds --steps of them (renumbered), then times
opening it (the lazy index), opening the app headless, and moving to the last step and back.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from spectrace.core.trace_reader import TraceFile
from spectrace.viz.tui.app import Walkthrough


def synthesize(src: Path, steps: int, out: Path) -> None:
    lines = src.read_text(encoding="utf-8").splitlines()
    head = [l for l in lines if not l.startswith('{"kind": "step"') and not l.startswith('{"kind": "summary"')]
    body = [json.loads(l) for l in lines if l.startswith('{"kind": "step"')]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(head) + "\n")
        for i in range(steps):
            rec = dict(body[i % len(body)], step=i)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


async def _drive(trace: TraceFile) -> tuple[float, float]:
    t0 = time.perf_counter()
    app = Walkthrough(trace)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        app.position = len(app.by_request[app.request]) - 1
        app.action_step(0)
        await pilot.press("left", "right", "left_square_bracket", "down")
        await pilot.pause()
        move = time.perf_counter() - t1
    return first, move


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.viz.tui.loadbench")
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=10000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        big = Path(d) / "big.jsonl"
        synthesize(args.trace, args.steps, big)
        t0 = time.perf_counter()
        trace = TraceFile(big)
        index_s = time.perf_counter() - t0
        first, move = asyncio.run(_drive(trace))
        size = big.stat().st_size / 1e6
    print(f"{len(trace)} steps, {size:.1f} MB: index {index_s:.2f} s; app open and first render {first:.2f} s; "
          f"jump to the last step and four keys {move:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
