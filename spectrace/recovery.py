"""Traces as spectrace's commands open them: with the records of the frames a fast run left
beside its trace when it was killed before it built them (fast/frames.py), built on opening, in
memory. The reader itself (core/trace_reader.py) needs no torch; building the records does, so it is
imported only for a trace that has frames."""
from __future__ import annotations

from pathlib import Path

from spectrace.core.trace_reader import Trace, TraceFile, read_trace
from spectrace.errors import SpectraceError


def frame_records(trace: Path, header: dict, skip: set):
    """core/trace_reader.py's Recover: the frames' records but those the trace holds, and the target's
    tokenizer for their text (where it still loads; else the id in brackets)."""
    from spectrace.core.step_record import record_token_ids
    from spectrace.fast.records import recovered_records
    from spectrace.loading.tokenizer import load_tokenizer

    try:
        token_text = load_tokenizer(header["config"]["target_model"]).piece
    except (SpectraceError, OSError, KeyError, TypeError, ValueError):
        def token_text(token_id: int) -> str:
            return f"<{token_id}>"
    return ((rec, record_token_ids(rec)) for rec in recovered_records(trace, skip)), token_text


def open_trace(path: str | Path) -> TraceFile:
    return TraceFile(path, frame_records)


def read_whole(path: str | Path) -> Trace:
    return read_trace(path, frame_records)
