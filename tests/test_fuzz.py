"""What any input does to the command line and the viewers (hypothesis): a mutated trace (deep
nesting, a huge string, NaN, a value of the wrong type, a key twice, a cut) and arbitrary
arguments end in exit code 0 or 2 with no traceback, and no output file is left invalid.
The walkthrough, driven in-process, shows a record it cannot show as a one-line reason instead."""
import asyncio
import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrace.cli import main
from spectrace.core.trace import TraceError
from spectrace.core.trace_reader import TraceFile

TRACE = Path(__file__).with_name("data") / "walkthrough.jsonl"
LINES = TRACE.read_text(encoding="utf-8").splitlines(keepends=True)
FIRST_STEP = next(i for i, line in enumerate(LINES) if line.startswith('{"kind": "step"'))


def _paths(x, at=()):
    """Every place in a JSON value: (path, value)."""
    yield at, x
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, at + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, at + (i,))


def _set(x, path, value):
    for k in path[:-1]:
        x = x[k]
    x[path[-1]] = value


REPLACEMENTS = {
    "nan": lambda: float("nan"), "inf": lambda: float("-inf"), "null": lambda: None,
    "huge string": lambda: "x" * 100_000, "string": lambda: "3", "negative": lambda: -7, "big int": lambda: 10**30,
    "float": lambda: 0.5, "bool": lambda: True,
    "empty list": lambda: [], "list": lambda: [1, 2, 3], "object": lambda: {"a": 1}, "deep": lambda: "__DEEP__",
}
DEEP = "[" * 5000 + "]" * 5000  # nested past the parser's recursion limit, spliced in as text


def mutate(data: st.DataObject) -> str:
    """The committed walkthrough trace with one thing changed, as file text: a value, a key, a cut,
    a tree's parents (any ints, a node its own or a later node's parent included), or the order of
    the step records (shuffled, one repeated)."""
    lines = list(LINES)
    kind = data.draw(st.sampled_from(["value", "value", "value", "duplicate key", "cut", "delete key", "tree",
                                      "order"]))
    if kind == "order":
        steps = [line for line in lines if line.startswith('{"kind": "step"')]
        steps = data.draw(st.permutations(steps)) + data.draw(st.lists(st.sampled_from(steps), max_size=1))
        return "".join(lines[:FIRST_STEP] + steps + [line for line in lines[FIRST_STEP:] if line not in steps])
    if kind == "tree":
        drafted = [j for j in range(FIRST_STEP, len(lines)) if '"parents": [' in lines[j]]
        j = data.draw(st.sampled_from(drafted))
        rec = json.loads(lines[j])
        n = len(rec["draft"]["parents"])
        rec["draft"]["parents"] = data.draw(st.lists(st.integers(-2, n + 1), min_size=n, max_size=n))
        lines[j] = json.dumps(rec) + "\n"
        return "".join(lines)
    i = data.draw(st.integers(0, len(lines) - 1) if kind == "cut" else st.integers(FIRST_STEP, FIRST_STEP + 3))
    if kind == "cut":
        return "".join(lines[:i]) + lines[i][:data.draw(st.integers(0, len(lines[i]) - 1))]
    rec = json.loads(lines[i])
    places = [p for p, _ in _paths(rec) if p and p[-1] != "kind"]
    path = data.draw(st.sampled_from(places))
    if kind == "value":
        _set(rec, path, REPLACEMENTS[data.draw(st.sampled_from(sorted(REPLACEMENTS)))]())
        text = json.dumps(rec).replace('"__DEEP__"', DEEP)  # NaN as a bare token, as careless writers leave it
    elif kind == "delete key":
        parent = rec
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict):
            del parent[path[-1]]
        text = json.dumps(rec)
    else:  # the line's first key written twice
        text = json.dumps(rec)
        text = "{" + text[1:text.index(",")] + ", " + text[1:]
    lines[i] = text + "\n"
    return "".join(lines)


def no_traceback(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    return err


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_trace_is_read_or_refused_in_one_line(tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "t.jsonl"
    path.write_text(mutate(data), encoding="utf-8")
    dot, perfetto, csv = tmp / "s.dot", tmp / "t.json", tmp / "t.csv"
    step = data.draw(st.integers(0, 3))
    for argv, out, valid in [
        (["render", str(path), "--step", str(step), "-o", str(dot)], dot, lambda t: t.startswith("digraph")),
        (["export", str(path), "-o", str(perfetto)], perfetto,
         lambda t: json.loads(t, parse_constant=lambda c: pytest.fail(c)) is not None),
        (["export", str(path), "--format", "csv", "-o", str(csv)], csv, lambda t: t.startswith("step,")),
    ]:
        code = main(argv)
        err = no_traceback(capsys)
        assert code in (0, 2), (argv, err)
        if code == 2:  # one error line (notes about the trace may come before it)
            assert [line.startswith("spectrace: error:") for line in err.strip().splitlines()][-1:] == [True], err
            assert err.count("error:") == 1, err
        if out.exists():
            assert valid(out.read_text(encoding="utf-8")), argv
            out.unlink()
    # the walkthrough: refused at open, or every panel of the first steps drawn (a record it cannot
    # show says why in the inspector)
    try:
        trace = TraceFile(path)
    except TraceError:
        return
    if not trace.index:
        return
    from spectrace.viz.tui.app import Walkthrough

    async def walk():
        app = Walkthrough(trace)
        async with app.run_test(size=(100, 30)) as pilot:
            for key in ["right_square_bracket"] * 7 + ["right", "down", "r", "right", "g"]:
                await pilot.press(key)
            return app.is_running
    assert asyncio.run(walk())  # still open: nothing ended it
    no_traceback(capsys)


ARGS = {
    "run": ["--algo", "--topk", "--num-steps", "--num-draft-tokens", "--acceptance", "--temperature", "--batch",
            "--max-new-tokens", "--prompt", "--trace", "--trace-level", "--device", "--backend", "--seed",
            "--medusa-choices", "--draft-model", "--speculative-config", "--no-tui", "--dtype"],
    "bench": ["--algos", "--batch-sizes", "--repeat", "--profile", "--json", "--device", "--backend", "--target-shape"],
    "render": ["--step", "--request", "--all", "-o"],
    "export": ["--format", "-o"],
    "rejudge": ["--acceptance", "--temperature", "-o"],
    "replay": [],
}
FLAGS = {"--no-tui", "--profile", "--all"}
VALUES = ["0", "-1", "1", "3", "100000", "nan", "inf", "1e309", "", "eagle", "foo", "greedy", "cuda", "fast",
          "{", '{"method": "EAGLE"}', "/dev/null", "/nonexistent/dir/x.jsonl", "x" * 300, "--", "-o"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_arbitrary_arguments_end_in_0_or_2_without_a_traceback(tmp_path_factory, capsys, monkeypatch, data):
    """Argument lists that cannot start a run (each gets a bad value or a missing file), so no
    model loads: the check before the work is what is fuzzed."""
    tmp = tmp_path_factory.mktemp("args")
    monkeypatch.chdir(tmp)
    command = data.draw(st.sampled_from(sorted(ARGS)))
    argv = [command]
    if command in ("replay", "render", "export", "rejudge"):
        argv.append(data.draw(st.sampled_from([str(TRACE), "missing.jsonl", "/dev/null", "x" * 300])))
    for _ in range(data.draw(st.integers(0, 5)) if ARGS[command] else 0):  # options, each with a value
        option = data.draw(st.sampled_from(ARGS[command]))
        argv += [option] if option in FLAGS else [option, data.draw(st.sampled_from(VALUES))]
    argv += data.draw(st.lists(st.sampled_from(VALUES), max_size=1))  # now and then a stray word
    if command in ("run", "bench"):  # a bad value no run starts with
        argv += data.draw(st.sampled_from([["--max-new-tokens", "0"], ["--batch", "-1"], ["--topk", "0"],
                                           ["--temperature", "nan"], ["--algo", "foo"], ["--device", "tpu"]]))
    if command == "replay":
        monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = no_traceback(capsys)
    assert code in (0, 2), (argv, err)
