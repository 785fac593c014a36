"""What a report costs: for runs of growing size, the trace's steps and bytes, the time `spectrace
report` takes to write the page, the page's bytes, and the time chromium takes to open it from disk
(navigation start to the page's script done, the median of three opens in one headless browser).

    python docs/report_times.py [--sizes 16x256 128x256]    BxT: --batch B --max-new-tokens T

Each size is `spectrace run --no-tui --algo eagle --topk 4` on the embedded pair (the explicit
engine on this machine's CPU: 128x256, about 10,000 steps, takes minutes). docs/walkthrough.md's
table comes from here. Needs chromium, chromedriver and selenium (spectrace/report/browser.py).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--sizes", nargs="+", default=["16x256", "128x256"], metavar="BxT")
    args = ap.parse_args()
    from spectrace.core.trace_reader import TraceFile
    from spectrace.report.browser import headless_chromium

    tmp = Path(tempfile.mkdtemp(prefix="spectrace-report-"))
    print(f"{'run':>8} {'steps':>7} {'trace MB':>9} {'write s':>8} {'page MB':>8} {'page/step KB':>12} {'open ms':>8}")
    with headless_chromium() as browser:
        for size in args.sizes:
            batch, tokens = size.split("x")
            trace, page = tmp / f"{size}.jsonl", tmp / f"{size}.html"
            subprocess.run([sys.executable, "-m", "spectrace", "run", "--no-tui", "--algo", "eagle", "--topk", "4",
                            "--batch", batch, "--max-new-tokens", tokens, "--trace", str(trace)], check=True,
                           stdout=subprocess.DEVNULL)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "spectrace", "report", str(trace), "-o", str(page)], check=True,
                           stdout=subprocess.DEVNULL)
            write_s = time.perf_counter() - t0
            opens = []
            for _ in range(3):
                browser.get(page.as_uri())
                opens.append(int(browser.find_element("tag name", "body").get_attribute("data-ready-ms")))
            steps = len(TraceFile(trace))
            print(f"{size:>8} {steps:>7} {trace.stat().st_size / 1e6:>9.1f} {write_s:>8.2f} "
                  f"{page.stat().st_size / 1e6:>8.1f} {page.stat().st_size / steps / 1e3:>12.2f} "
                  f"{statistics.median(opens):>8}")


if __name__ == "__main__":
    main()
