"""`spectrace export` (spectrace/timeline.py): the Perfetto timeline has one complete event per
phase per decode step, end to end, with the recorded durations; the CSV one row per step and
request with the record's values; bad output paths and traces are one line."""
import csv
import json
from pathlib import Path

import pytest

from spectrace.cli import main
from spectrace.core.trace_reader import read_trace
from spectrace.timeline import PHASES

TRACE = Path(__file__).with_name("data") / "walkthrough.jsonl"


def test_perfetto_events_are_the_phases_of_every_step_end_to_end(tmp_path):
    assert main(["export", str(TRACE), "-o", str(tmp_path / "t.json")]) == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    trace = read_trace(TRACE)
    steps = {}
    for rec in trace.steps:
        steps.setdefault(rec["step"], []).append(rec)
    want = [(p, s) for s, recs in sorted(steps.items()) for p in PHASES if p in recs[0]["timing"]]
    step_events = [e for e in complete if "step" in e["args"]]
    assert [(e["name"], e["args"]["step"]) for e in step_events] == want
    for e in step_events:  # durations in microseconds, the step's requests and batch in args
        recs = steps[e["args"]["step"]]
        assert e["dur"] == pytest.approx(recs[0]["timing"][e["name"]] * 1000)
        assert e["args"]["accept_len"] == {str(r["request"]): r["accept_len"] for r in recs}
        assert e["args"]["batch"] == recs[0]["timing"]["batch_size"]
    for a, b in zip(complete, complete[1:]):  # one after another, no overlap, no gap
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    assert complete[0]["name"] == "prefill" and complete[0]["ts"] == 0


def test_csv_has_a_row_per_step_and_request(tmp_path):
    assert main(["export", str(TRACE), "--format", "csv", "-o", str(tmp_path / "t.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    recs = read_trace(TRACE).steps
    assert len(rows) == len(recs)
    for row, rec in zip(rows, recs):
        assert (int(row["step"]), int(row["request"]), int(row["accept_len"]), int(row["bonus_token"])) == \
            (rec["step"], rec["request"], rec["accept_len"], rec["bonus_token"])
        assert row["correct_drafts"].split() == [str(t) for t in rec["correct_drafts"]]
        assert float(row["verify_ms"]) == rec["timing"]["verify"]


@pytest.mark.parametrize("args, message", [
    (["-o", "/proc/nonexistent/t.json"], "cannot write"),
    (["--format", "svg", "-o", "x"], "invalid choice"),
])
def test_export_bad_input_is_one_line(capsys, args, message):
    try:
        code = main(["export", str(TRACE), *args])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err


def test_export_of_a_bad_trace_is_one_line(capsys, tmp_path):
    (tmp_path / "bad.jsonl").write_text("{garbage\n")
    assert main(["export", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "t.json")]) == 2
    assert "not a spectrace trace" in capsys.readouterr().err


def test_durations_that_are_not_numbers_leave_the_json_valid(tmp_path):
    """A trace whose timings hold NaN, inf or a string (a clock that failed, a hand-edited file):
    Perfetto's file stays strict JSON (no bare NaN, which JSON.parse rejects), the bad phases are
    left out and the rest keep their order; the CSV leaves those cells empty."""
    lines = TRACE.read_text().splitlines()
    bad = {"draft": float("nan"), "verify": float("inf"), "accept": "slow"}
    out_lines, hit = [], 0
    for line in lines:
        rec = json.loads(line)
        if rec.get("type", "step") == "step" and "timing" in rec and hit < 3:
            rec["timing"].update(bad)
            hit += 1
        out_lines.append(json.dumps(rec))
    bad_trace = tmp_path / "nan.jsonl"
    bad_trace.write_text("\n".join(out_lines) + "\n")
    assert hit and main(["export", str(bad_trace), "-o", str(tmp_path / "t.json")]) == 0
    text = (tmp_path / "t.json").read_text()

    def refuse(token):
        raise AssertionError(f"bare {token} in the export")

    events = json.loads(text, parse_constant=refuse)["traceEvents"]
    assert all(isinstance(e.get("dur", 0), (int, float)) for e in events)
    assert [e["ts"] for e in events if e["ph"] == "X"] == sorted(e["ts"] for e in events if e["ph"] == "X")
    assert main(["export", str(bad_trace), "--format", "csv", "-o", str(tmp_path / "t.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert any(r["draft_ms"] == "" and r["verify_ms"] == "" and r["accept_ms"] == "" for r in rows)
