"""What every lesson shares: live runs on the embedded models, the walkthrough's screen, a step's
tree as a figure, and the goldens the "check yourself" cells compare with.

    run(name, algo=..., ...)    an in-process `spectrace run` (24 new tokens unless told), its
                                trace in OUT; returns (RunResult, TraceFile)
    screen(trace, keys, size)   the walkthrough after `keys`, as text (an SVG beside it in OUT)
    at(phase)                   the keys from where the walkthrough opens (DRAFT 1) to a phase
    tree_figure(trace, i)       step i's draft tree as an SVG in OUT (`spectrace render`)
    show(figure, name)          a matplotlib figure (saved as OUT/<name>.png) or an SVG's path:
                                inline in a notebook, its path printed by a script
    expect(lesson, key, value)  a value a run produced, against lessons/expected.json

Environment: SPECTRACE_LESSON_OUT (default lessons/_out, git-ignored) takes the figures and
traces; SPECTRACE_LESSON_CI=1 (the test suite) skips what only a reader needs (figures' files
are still written; nothing is opened); SPECTRACE_UPDATE_LESSONS=1 rewrites expected.json from
the runs (read the diff). Values a chapter states (formula tables, worked examples) are computed
in the lesson and compared there, never taken from expected.json.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import matplotlib

from spectrace.core.trace import TraceError

from spectrace.core.trace_reader import TraceFile
from spectrace.errors import SpectraceError
from spectrace.run import RunConfig, RunResult
from spectrace.run import run as spectrace_run

HERE = Path(__file__).parent
ROOT = HERE.parent  # the repository: tests/data holds the fixture traces lessons read
WALKTHROUGH = ROOT / "tests" / "data" / "walkthrough.jsonl"  # a committed EAGLE run, from any working directory


def _writable(out: Path) -> Path:
    """OUT, made and checked once: a place the lessons cannot write is one line and exit 2."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".writable").write_text("")
        (out / ".writable").unlink()
    except OSError as e:
        print(f"lessons: cannot write to SPECTRACE_LESSON_OUT={out}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    return out


OUT = _writable(Path(os.environ.get("SPECTRACE_LESSON_OUT", HERE / "_out")))
CI = os.environ.get("SPECTRACE_LESSON_CI") == "1"
EXPECTED = HERE / "expected.json"
UPDATE = os.environ.get("SPECTRACE_UPDATE_LESSONS") == "1"
NOTEBOOK = "ipykernel" in sys.modules  # a Jupyter kernel runs this lesson: figures show inline
if not NOTEBOOK:
    matplotlib.use("Agg")  # a script writes its figures to OUT and prints where


def _cannot_write(e: Exception):
    """A full disk (or a quota) under OUT: one line and exit 2, as a place the lessons cannot write."""
    print(f"lessons: cannot write to SPECTRACE_LESSON_OUT={OUT}: {getattr(e, 'strerror', None) or e}",
          file=sys.stderr)
    sys.exit(2)


def run(name: str, **options) -> tuple[RunResult, TraceFile]:
    """`spectrace run --no-tui` in-process, greedy fp32 on the CPU unless told; 24 new tokens."""
    cfg = RunConfig(**{"max_new_tokens": 24, "trace": str(OUT / f"{name}.jsonl"), **options})
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        result = spectrace_run(cfg)
    except (OSError, TraceError) as e:
        _cannot_write(e)
    return result, TraceFile(result.trace_path)


def screen(trace: TraceFile | str, keys=(), size=(110, 32), name: str = "screen") -> str:
    """The walkthrough's screen after `keys` as text; its SVG goes to OUT/<name>.svg."""
    from spectrace.viz.tui.snapshot import text_and_svg

    text, svg = text_and_svg(trace.path if isinstance(trace, TraceFile) else trace, keys, size)
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.svg").write_text(svg)
    except OSError as e:
        _cannot_write(e)
    return text


def at(phase: str) -> list[str]:
    """Keys from the first step's DRAFT 1 to `phase` of that step: to the last phase (EXTEND; a
    step has at most nine, the lessons drafting five levels at most), then back, since the number
    of draft levels differs from step to step."""
    back = ["EXTEND", "COMMIT", "ACCEPT", "VERIFY"].index(phase)
    return ["right_square_bracket"] * 8 + ["left_square_bracket"] * back


def tree_figure(trace: TraceFile, i: int, name: str) -> Path:
    """Step i's draft tree, as `spectrace render` draws it, in OUT/<name>.svg."""
    from spectrace.viz.graph import step_graph, write_figure

    try:
        return write_figure(step_graph(trace.step(i), trace.token_text), OUT / f"{name}.svg")
    except (OSError, SpectraceError) as e:
        _cannot_write(e)


def show(figure, name: str | None = None) -> None:
    """A matplotlib figure, saved as OUT/<name>.png, or the path of an SVG already in OUT: shown
    inline in a notebook, its path printed otherwise."""
    if isinstance(figure, Path):
        path = figure
    else:
        path = OUT / f"{name}.png"
        try:
            OUT.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, dpi=120)
        except OSError as e:
            _cannot_write(e)
    if NOTEBOOK:
        from IPython.display import SVG, Image, display

        display(SVG(filename=str(path)) if path.suffix == ".svg" else Image(filename=str(path)))
        if not isinstance(figure, Path):
            import matplotlib.pyplot as plt

            plt.close(figure)  # shown once, not again at the cell's end
    else:
        print("figure:", path)


def expect(lesson: str, key: str, value):
    """Assert `value` equals the golden recorded for lesson/key (floats to 4 decimals); with
    SPECTRACE_UPDATE_LESSONS=1, record it instead."""
    goldens = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    value = round(value, 4) if isinstance(value, float) else value
    if UPDATE:
        goldens.setdefault(lesson, {})[key] = value
        EXPECTED.write_text(json.dumps(goldens, indent=1, sort_keys=True) + "\n")
        return
    want = goldens.get(lesson, {}).get(key)
    assert value == want, f"{lesson}/{key}: got {value!r}, expected {want!r} (lessons/expected.json)"
