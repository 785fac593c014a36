"""The live walkthrough (viz/tui/live.py): up before the run has loaded, its status shown; the run's
first steps as soon as they are written, the whole trace when the run ends, the reader's place kept;
a run that fails closes the app and says its line; `spectrace run` in a terminal does all of it."""
import asyncio
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

from spectrace.core.trace_reader import TraceFile
from spectrace.progress import STATUS, WRITTEN
from spectrace.viz.tui.live import LiveWalkthrough
from spectrace.viz.tui.snapshot import screen_text

TRACE = Path(__file__).with_name("data") / "walkthrough.jsonl"
DOCS = Path(__file__).resolve().parent.parent / "docs"

# A stand-in for `spectrace run --no-tui`: copies a committed trace as a run writes one, its status
# on stderr, waiting for a go file before its first step and again before the rest.
FAKE_RUN = textwrap.dedent(f"""
    import os, sys, time
    src, dst, go = sys.argv[1:]
    def wait(n):
        while not os.path.exists(go + str(n)):
            time.sleep(0.01)
    def status(message):
        print({STATUS!r} + message, file=sys.stderr, flush=True)
    lines = open(src).read().splitlines(True)
    steps = [i for i, line in enumerate(lines) if line.startswith('{{"kind": "step"')]
    status("loading torch")
    wait(1)
    with open(dst, "w") as f:
        f.writelines(lines[:steps[2]])  # the header, the prefills, two step records
        f.flush()
        status("generating: 3 of at most 64 tokens")
        wait(2)
        f.writelines(lines[steps[2]:])
    status({WRITTEN!r})
    print("the summary")
""")


def test_the_app_is_up_before_the_run_then_shows_its_steps_as_written(tmp_path):
    out, go = tmp_path / "t.jsonl", tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", FAKE_RUN, str(TRACE), str(out), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def until(pilot, ready):
        for _ in range(500):
            if ready():
                return
            await pilot.pause(0.01)
        raise AssertionError("the app never got there")

    async def go_on():
        app = LiveWalkthrough(child, str(out), "run --algo eagle")
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "loading torch" in screen_text(app))
            loading = screen_text(app)
            assert "run --algo eagle" in loading and "while the run loads" in loading
            await pilot.press("right", "]")  # keys before a trace is there do nothing
            (tmp_path / "go1").touch()
            await until(pilot, lambda: app.trace is not None)
            early = {r: len(steps) for r, steps in app.by_request.items()}
            assert sum(early.values()) == 2 and "tree · DRAFT 1" in screen_text(app)
            await pilot.press("right_square_bracket")
            phase = app.phase_name
            (tmp_path / "go2").touch()
            await until(pilot, lambda: app.written and len(app.trace.index) > 2)
            await pilot.pause()
            whole = TraceFile(TRACE)
            assert {r: len(s) for r, s in app.by_request.items()} == \
                {r: sum(m.request == r for m in whole.index) for r in early}
            assert app.phase_name == phase and app.position == 0  # where the reader was
        return app

    app = asyncio.run(go_on())
    child.wait()
    assert app.said == [] and app.problem is None
    assert child.stdout.read() == "the summary\n"


def test_a_run_that_fails_closes_the_app_with_its_line(tmp_path):
    failing = "import sys; print('spectrace: error: --target-model /x: no such directory', file=sys.stderr); sys.exit(2)"
    child = subprocess.Popen([sys.executable, "-c", failing], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def go_on():
        app = LiveWalkthrough(child, str(tmp_path / "t.jsonl"), "run")
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(500):
                if not app.is_running:
                    break
                await pilot.pause(0.01)
            assert not app.is_running, "the app closes by itself"
        return app

    app = asyncio.run(go_on())
    assert child.wait() == 2
    assert app.said == ["spectrace: error: --target-model /x: no such directory\n"]


def test_spectrace_run_in_a_terminal_draws_at_once_then_the_run(tmp_path):
    spec = importlib.util.spec_from_file_location("startup_times", DOCS / "startup_times.py")
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)
    trace = tmp_path / "t.jsonl"
    first, found, _, code, out = startup.in_a_terminal(
        ["run", "--algo", "eagle", "--topk", "4", "--max-new-tokens", "8", "--trace", str(trace)],
        (startup.UP, startup.DRAWN))
    assert code == 0, out[-2000:]
    assert first < found[startup.UP] < found[startup.DRAWN]
    assert f"trace: {trace}" in out  # the run's summary, after the app closed
    assert TraceFile(trace).summary is not None


def test_a_walkthrough_that_cannot_show_the_run_closes_with_a_line(tmp_path):
    """A failure while following the run (here: showing its trace) closes the app and says why,
    instead of leaving it on the loading screen."""
    child = subprocess.Popen([sys.executable, "-c", f"import sys; print({STATUS + WRITTEN!r}, file=sys.stderr)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def go_on():
        app = LiveWalkthrough(child, str(TRACE), "run")
        app.show = lambda *args: 1 / 0
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(500):
                if not app.is_running:
                    break
                await pilot.pause(0.01)
            assert not app.is_running
        return app

    app = asyncio.run(go_on())
    child.wait()
    assert app.problem == "the walkthrough stopped following the run: ZeroDivisionError('division by zero')"
