"""`spectrace export`: a trace's phases on a timeline, for Perfetto / chrome://tracing, or as CSV.

    perfetto  Chrome trace-event JSON: {"traceEvents": [...]}, complete events ("ph": "X", times
              in microseconds), one per phase per decode step (draft, verify, accept, commit,
              extend; a batch's requests share their step's phases), after the prefill's;
              args: the step, each request's accept_len, the batch size
    csv       one row per step and request: step, request, accept_len, correct drafts, bonus,
              batch size and each phase's ms, for pandas

The trace records each phase's duration, not when it began, so the timeline lays the phases end
to end: what the host did between them (the explicit engine's bookkeeping, the fast engine's
overlap) is not on it. A duration that is not a finite number of milliseconds (NaN, inf, a
string) has no place on a timeline: its event is left out (CSV: an empty cell), so the JSON stays
valid (no bare NaN) and the phases after it keep their order. Torch-free, like every reader of traces.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from spectrace.core.trace_reader import Trace

PHASES = ("draft", "verify", "accept", "commit", "extend")  # a step's phases, in the order they run
PREFILL_PHASES = ("prefill", "extend", "draft_extend")  # the target's pass, the drafter's (older traces: draft_extend)
US_PER_MS = 1000.0


def _ms(value) -> float | None:
    """A recorded duration in ms, or None where it is not a finite number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def perfetto(trace: Trace, name: str) -> dict:
    """The trace-event JSON of a whole trace (process `name`, one thread: the engine)."""
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": name}},
              {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "engine"}}]
    t = 0.0

    def add(phase: str, ms, args: dict) -> None:
        nonlocal t
        if (ms := _ms(ms)) is None:
            return
        events.append({"name": phase, "ph": "X", "ts": round(t, 3), "dur": round(ms * US_PER_MS, 3), "pid": 1,
                       "tid": 1, "args": args})
        t += ms * US_PER_MS

    if trace.prefills:  # a batch's prefill is one pass: its timing is on every request's record
        timing = trace.prefills[0]["timing"]
        for phase in PREFILL_PHASES:
            if phase in timing:
                add("prefill" if phase == "prefill" else "extend (prefill)", timing[phase],
                    {"requests": len(trace.prefills)})
    by_step: dict[int, list[dict]] = {}
    for rec in trace.steps:
        by_step.setdefault(rec["step"], []).append(rec)
    for step, recs in sorted(by_step.items()):
        timing = recs[0]["timing"]
        args = {"step": step, "accept_len": {str(r["request"]): r["accept_len"] for r in recs},
                "batch": timing.get("batch_size", len(recs))}
        for phase in PHASES:
            if phase in timing:
                add(phase, timing[phase], args)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"note": "phases laid end to end from their recorded durations"}}


def csv_rows(trace: Trace) -> list[dict]:
    rows = []
    for rec in trace.steps:
        timing = rec["timing"]
        rows.append({"step": rec["step"], "request": rec["request"], "accept_len": rec["accept_len"],
                     "correct_drafts": " ".join(map(str, rec["correct_drafts"])), "bonus_token": rec["bonus_token"],
                     "batch_size": timing.get("batch_size", ""),
                     **{f"{phase}_ms": "" if _ms(timing.get(phase)) is None else timing[phase]
                        for phase in PHASES}})
    return rows


def export(trace: Trace, fmt: str, out: Path) -> Path:
    """Write `trace` to `out` as `fmt` (perfetto or csv); returns the path."""
    if fmt == "perfetto":
        name = f"spectrace {trace.header.get('config', {}).get('algo', '')}".strip()
        out.write_text(json.dumps(perfetto(trace, name), allow_nan=False), encoding="utf-8")
        return out
    rows = csv_rows(trace)
    with open(out, "w", newline="", encoding="utf-8") as f:
        fields = ["step", "request", "accept_len", "correct_drafts", "bonus_token", "batch_size",
                  *(f"{phase}_ms" for phase in PHASES)]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return out
