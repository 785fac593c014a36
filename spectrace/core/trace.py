"""Trace format v1: JSON Lines, one record per line, flushed as it is written.

    {"kind": "header", "schema": "spectrace.trace/1", "config": {...}, "models": {...}, "tokens":
    {...}}
    {"kind": "prefill", "request": r, ...}                      one per request
    {"kind": "step", "step": s, "request": r, "correct_drafts": [...], "bonus_token": t,
     "accept_tokens": [...], "accept_len": n, "draft": {...}, "verify": {...}, "accept": {...},
     "kv": {...}, "timing": {...}, "tokens": {...}}            one per decode step per request
    {"kind": "summary", "metrics": {...}, "requests": [...]}   last, when the run finished

A fast run keeps its step records as frames beside the trace, TRACE.frames (fast/frames.py),
which readers build (docs/trace-format.md). A run killed mid-way leaves every line it wrote. Token
strings travel with the trace: each record's "tokens" maps ids first mentioned there to their
text, so a viewer needs neither tokenizer nor model. Here the format and its writer;
core/trace_reader.py reads it (no torch).
"""
from __future__ import annotations

import json
import math
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable


try:
    import fcntl
except ImportError:  # not POSIX: traces are not locked
    fcntl = None

SCHEMA = "spectrace.trace/1"
SCHEMA_PREFIX = "spectrace.trace/"



class TraceError(Exception):
    """The trace cannot be read; the message says why in one line."""


# what reading a field of the wrong shape raises: a list where a number was, a missing key, an
# index past a list's end, a string where a token id was
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError)


def malformed(path, where: str, e: Exception) -> TraceError:
    """where: the record's place (StepMeta.where: "line 12", or "step 3, request 0" in a frame)."""
    what = str(e)[:80] if not isinstance(e, KeyError) else f"no field {e.args[0]!r}"[:80]
    return TraceError(f"trace {path}: the record at {where} has a field of the wrong "
                      f"shape ({what})")


class RecordFormat:
    """A record as its trace line: JSON with the text of the token ids it mentions first."""

    def __init__(self, token_text: Callable[[int], str], seen: Iterable[int] = ()):
        self._token_text = token_text
        self._seen: set[int] = set(seen)
        self._mentioned: dict[str, str] = {}

    def _new_tokens(self, ids: Iterable[int]) -> dict[str, str]:
        new = sorted({int(i) for i in ids} - self._seen)
        self._seen.update(new)
        return {str(i): self._token_text(i) for i in new}

    def mention(self, token_ids: Iterable[int]) -> None:
        """Token ids whose text the next line carries, beside its own."""
        self._mentioned = self._new_tokens(token_ids)

    def line(self, record: dict, token_ids: Iterable[int] = ()) -> bytes:
        record = dict(record)
        record["tokens"] = {**self._mentioned, **self._new_tokens(token_ids)}
        self._mentioned = {}
        try:
            text = json.dumps(record, ensure_ascii=False, allow_nan=False)
        # NaN or ±inf somewhere (a diverged model's q, a clock): JSON has no such number
        except ValueError:
            text = json.dumps(finite(record), ensure_ascii=False, allow_nan=False)
        return (text + "\n").encode("utf-8")


def _locked(path: Path):
    """The file opened for writing, emptied once this process holds its lock: a second run writing
    the same trace is refused instead of interleaving its lines into the first one's (devices such
    as /dev/null are shared freely)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    if stat.S_ISREG(os.fstat(fd).st_mode) and fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TraceError(f"cannot write trace {path}: another run is writing it") from None
        os.ftruncate(fd, 0)
    return os.fdopen(fd, "wb")


class TraceWriter:
    """Writes one JSON object per line, and flushes after each record, or after a step's records
    (write(..., flush=False), then flush()), so readers see every finished step."""

    def __init__(self, path: str | Path, token_text: Callable[[int], str]):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # its open would wait for a reader
            if self.path.exists() and stat.S_ISFIFO(os.stat(self.path).st_mode):
                raise TraceError(f"cannot write trace {self.path}: it "
                                 f"is a FIFO, and a trace is a file")
            self._f = _locked(self.path)  # UTF-8 lines, written whole
            if self.path.is_file() and has_frames(self.path):  # an earlier run's steps
                frames_path(self.path).unlink()
        except OSError as e:
            raise TraceError(f"cannot write trace {self.path}: {e.strerror}") from None
        self._format = RecordFormat(token_text)
        self.run_id = uuid.uuid4().hex  # in the header and in a fast run's frames: they go together
        self._size = 0  # bytes of whole records on disk
        self._pending = 0  # bytes written since the last flush
        self.failed = False  # a write failed: the file ends at the last whole record

    def write(self, record: dict, token_ids: Iterable[int] = (), flush: bool = True) -> None:
        line = self._format.line(record, token_ids)
        try:
            self._f.write(line)
        except OSError as e:
            self._fail(e)
        self._pending += len(line)
        if flush:
            self.flush()

    def mention(self, token_ids: Iterable[int]) -> None:
        """Token ids the trace's steps mention outside its lines (a fast run's frames): their
        text goes into the next record written (the summary)."""
        self._format.mention(token_ids)

    def flush(self) -> None:
        """Every record written so far onto the disk (one system call for a step's records)."""
        try:
            self._f.flush()
        except OSError as e:
            self._fail(e)
        self._size, self._pending = self._size + self._pending, 0

    def _fail(self, e: OSError) -> None:
        """A record that did not fit (a full disk, say): the file is cut back to the last flush,
        which ended a whole record, so it stays readable up to the last finished step, and the
        error says why."""
        self.failed = True
        try:
            self._f.close()  # what the buffer still holds cannot be written either
        except OSError:
            pass
        try:
            os.truncate(self.path, self._size)
        except OSError:
            pass  # a device (/dev/full) has no length to cut
        raise TraceError(f"cannot write trace {self.path}: {e.strerror}") from None

    def close(self) -> None:
        if self.failed:
            return
        try:
            self._f.close()
        except OSError as e:
            self._fail(e)

    def discard(self) -> None:
        """Remove the trace (a run refused before it began): a file only, never a device such as
        /dev/null that --trace named."""
        if self.path.is_file():
            self.path.unlink(missing_ok=True)
            if has_frames(self.path):  # never a FIFO or a device put there
                frames_path(self.path).unlink()


def default_trace_path(algo: str) -> Path:
    """Where a run writes its trace when --trace is not given."""
    return Path(f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{algo}.jsonl")


def has_frames(trace: str | Path) -> bool:
    """Whether a regular file of frames lies beside the trace (a name too long for the file
    system, with .frames added, has none)."""
    try:
        return frames_path(trace).is_file()
    except OSError:
        return False


def frames_path(trace: str | Path) -> Path:
    """Where a fast run keeps its steps' frames until it has built their records
    (fast/frames.py)."""
    trace = Path(trace)
    return trace.with_name(trace.name + ".frames")


def finite(x):
    """x with every float that is not finite replaced by None (null in the trace)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x
