"""Traces as spectrace's commands open them: a fast run's steps, which it keeps in its frames
beside the trace (TRACE.frames, fast/frames.py), each built when a reader asks for it
(fast/records.py: FrameSteps). The reader itself (core/trace_reader.py) needs no torch; building
the records does, so it is imported only for a trace that has frames."""
from __future__ import annotations

import os
from pathlib import Path

from spectrace.core.trace_reader import Trace, TraceFile, read_trace
from spectrace.errors import SpectraceError


class TokenText:
    """The text of a token id by the target's tokenizer, loaded the first time one is asked for
    (a finished run's trace carries the text of every id its frames mention); where it no longer
    loads, the id in brackets."""

    def __init__(self, header: dict):
        self.header, self.piece = header, None

    def __call__(self, token_id: int) -> str:
        if self.piece is None:
            from spectrace.loading.tokenizer import load_tokenizer

            try:
                self.piece = load_tokenizer(self.header["config"]["target_model"]).piece
            except (SpectraceError, OSError, KeyError, TypeError, ValueError):
                self.piece = lambda t: f"<{t}>"
        return self.piece(token_id)


def frame_steps(trace: Path, header: dict, skip: set):
    """core/trace_reader.py's OpenFrames: the frames' steps but those the trace's lines hold."""
    from spectrace.fast.records import FrameSteps

    return FrameSteps(trace, skip, TokenText(header), header.get("run"))


def open_trace(path: str | Path) -> TraceFile:
    return TraceFile(path, frame_steps)


def read_whole(path: str | Path) -> Trace:
    return read_trace(path, frame_steps)


def write_whole(trace: Trace, out: Path) -> Path:
    """`trace` as one self-contained JSON Lines file, every step a line (the format an explicit run
    writes, which any JSON tool reads), each token's text with the line that first mentions it.
    Written to a temporary file beside `out`, then renamed: never half a file."""
    from spectrace.core.step_record import record_token_ids
    from spectrace.core.trace import RecordFormat

    fmt = RecordFormat(trace.token_text)
    mentions = [(trace.header, ()), *((p, ()) for p in trace.prefills),
                *((s, record_token_ids(s)) for s in trace.steps), *([(trace.summary, ())] if trace.summary else [])]
    tmp = out.with_name(f".{out.name}.part")
    try:
        with open(tmp, "wb") as f:
            for rec, ids in mentions:
                f.write(fmt.line({k: v for k, v in rec.items() if k != "tokens"},
                                 [*map(int, rec.get("tokens", {})), *ids]))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
