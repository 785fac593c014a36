"""The viewing commands of `spectrace` (cli.py's other half, beside measure/cli.py): replay,
render, export, rejudge and report, each reading a trace as spectrace/traces.py opens it (a fast
run's frames included). Torch-free at import; errors are SpectraceErrors: one line, exit code 2.
"""
from __future__ import annotations

import sys

from spectrace.core.ranges import check_ranges
from spectrace.errors import SpectraceError
from spectrace.progress import Progress


def refuse_overwriting(out, trace, flag: str) -> None:
    """`flag` OUT may not name the trace a command reads, nor the files beside it (its
    --record-probs sidecar, a fast run's frames): writing there would lose them."""
    from pathlib import Path

    from spectrace.core.probs import sidecar_path
    from spectrace.core.trace import frames_path

    out = Path(out).resolve()
    if out == Path(trace).resolve():
        raise SpectraceError(f"{flag} {out.name} would overwrite the trace {trace}: give another path")
    if out in (sidecar_path(trace).resolve(), frames_path(trace).resolve()):
        raise SpectraceError(f"{flag} {out.name} would overwrite a file the trace {trace} reads: give another path")


def report_of(trace, out) -> int:
    from spectrace.report.page import write_report

    refuse_overwriting(out, trace, "-o")

    print(f"report: {write_report(trace, out)}")
    return 0


def cmd_report(args) -> int:
    return report_of(args.trace, args.out)


def cmd_replay(args) -> int:
    progress = Progress(0)  # a large trace takes a moment to index: say so instead of a blank terminal
    progress.say("loading the walkthrough")
    from spectrace.core.trace import has_frames
    from spectrace.traces import open_trace
    from spectrace.viz.tui.app import replay
    from spectrace.viz.tui.opening import replay_opening

    progress.say(f"reading {args.trace}")
    try:
        if has_frames(args.trace):  # a fast run's steps: built behind the first screen
            replay_opening(args.trace, lambda: open_trace(args.trace))
        else:
            replay(open_trace(args.trace))
    finally:
        progress.done()
    return 0


def cmd_render(args) -> int:
    """One figure (--step N [--request R]) or one per step (--all)."""
    from pathlib import Path

    from spectrace.traces import open_trace
    from spectrace.viz.graph import step_graph, write_figure

    trace = open_trace(args.trace)
    for notice in trace.notices:
        print(f"spectrace: note: {notice}", file=sys.stderr)
    picked = [i for i, m in enumerate(trace.index)
              if (args.all or m.step == args.step) and args.request in (None, m.request)]
    if not args.all:
        if args.step is None:
            raise SpectraceError("render needs --step N (or --all)")
        if not picked:
            steps = sorted({m.step for m in trace.index})
            which = f"no step {args.step}" + (f" of request {args.request}" if args.request is not None else "")
            where = f"steps {steps[0]}..{steps[-1]}" if steps else "no decode steps"
            raise SpectraceError(f"{which} in {args.trace} ({where})")
        picked = picked[:1]
    out = Path(args.out)
    if not out.name:
        raise SpectraceError(f"-o {args.out!r} names no file (e.g. -o tree.svg)")
    for i in picked:
        rec = trace.step(i)
        path = out if not args.all else out.with_name(f"{out.stem}-step{rec['step']}-req{rec['request']}{out.suffix}")
        print(write_figure(trace.view(i, lambda rec: step_graph(rec, trace.token_text)), path))
    return 0


def cmd_export(args) -> int:
    """spectrace/timeline.py: the trace's phases for Perfetto, or a CSV for pandas; or the whole
    trace in one JSON Lines file (spectrace/traces.py: write_whole)."""
    from pathlib import Path

    from spectrace.core.trace import MALFORMED, TraceError
    from spectrace.traces import read_whole, write_whole
    from spectrace.timeline import export

    refuse_overwriting(args.out, args.trace, "-o")
    trace = read_whole(args.trace)
    try:  # built whole, then written: never half a file
        print(write_whole(trace, Path(args.out)) if args.format == "jsonl" else export(trace, args.format, Path(args.out)))
    except OSError as e:
        raise SpectraceError(f"cannot write {args.out}: {e.strerror}") from None
    except MALFORMED as e:
        raise TraceError(f"trace {args.trace}: a step record has a field of the wrong shape ({str(e)[:80]})") from None
    return 0


def cmd_rejudge(args) -> int:
    """spectrace/rejudge.py: the recorded steps under another rule; before -> after on stdout."""
    from pathlib import Path

    from spectrace.rejudge import Rejudge, report

    check_ranges(seed=args.seed)
    refuse_overwriting(args.out, args.trace, "-o")
    job = Rejudge(args.trace, args.acceptance, args.threshold_single, args.threshold_acc, args.temperature, args.seed)
    print(report(job, job.write(Path(args.out))))
    return 0
