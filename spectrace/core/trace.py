"""Trace format v1: JSON Lines, one record per line, flushed as it is written.

    {"kind": "header", "schema": "spectrace.trace/1", "config": {...}, "models": {...}, "tokens": {...}}
    {"kind": "prefill", "request": r, ...}                      one per request
    {"kind": "step", "step": s, "request": r, "correct_drafts": [...], "bonus_token": t,
     "accept_tokens": [...], "accept_len": n, "draft": {...}, "verify": {...}, "accept": {...},
     "kv": {...}, "timing": {...}, "tokens": {...}}            one per decode step per request
    {"kind": "summary", "metrics": {...}, "requests": [...]}   last, when the run finished

A run killed mid-way leaves every line it wrote; a torn last line is reported and skipped.
Token strings travel with the trace: each record's "tokens" maps ids first mentioned there to
their text, so a viewer needs neither tokenizer nor model. Reading needs no torch.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from spectrace.errors import SpectraceError

try:
    import fcntl
except ImportError:  # not POSIX: traces are not locked
    fcntl = None

SCHEMA = "spectrace.trace/1"
MAX_TOKEN_CHARS = 2 ** 20  # a token's text: real vocabularies stay under a few hundred characters
SCHEMA_PREFIX = "spectrace.trace/"
STEP_FIELDS = {"step": int, "request": int, "correct_drafts": list, "bonus_token": int,
               "accept_tokens": list, "accept_len": int, "draft": (dict, type(None)),
               "verify": dict, "accept": dict, "kv": dict, "timing": dict}


# (trace, its header, the (step, request) pairs it holds) -> (the records of its frames but those,
# each with the token ids it mentions; the text of a token id)
Recover = Callable[[Path, dict, set], tuple[Iterable[tuple[dict, Iterable[int]]], Callable[[int], str]]]


class TraceError(Exception):
    """The trace cannot be read; the message says why in one line."""


# what reading a field of the wrong shape raises: a list where a number was, a missing key, an
# index past a list's end, a string where a token id was
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError)


def malformed(path, lineno: int, e: Exception) -> TraceError:
    what = str(e)[:80] if not isinstance(e, KeyError) else f"no field {e.args[0]!r}"[:80]
    return TraceError(f"trace {path}: the record at line {lineno} has a field of the wrong shape ({what})")


class RecordFormat:
    """A record as its trace line: JSON with the text of the token ids it mentions first."""

    def __init__(self, token_text: Callable[[int], str], seen: Iterable[int] = ()):
        self._token_text = token_text
        self._seen: set[int] = set(seen)

    def _new_tokens(self, ids: Iterable[int]) -> dict[str, str]:
        new = sorted({int(i) for i in ids} - self._seen)
        self._seen.update(new)
        return {str(i): self._token_text(i) for i in new}

    def line(self, record: dict, token_ids: Iterable[int] = ()) -> bytes:
        record = dict(record)
        record["tokens"] = self._new_tokens(token_ids)
        try:
            text = json.dumps(record, ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or ±inf somewhere (a diverged model's q, a clock): JSON has no such number
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
            if self.path.exists() and stat.S_ISFIFO(os.stat(self.path).st_mode):  # its open would wait for a reader
                raise TraceError(f"cannot write trace {self.path}: it is a FIFO, and a trace is a file")
            self._f = _locked(self.path)  # UTF-8 lines, written whole
        except OSError as e:
            raise TraceError(f"cannot write trace {self.path}: {e.strerror}") from None
        self._format = RecordFormat(token_text)
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
            frames_path(self.path).unlink(missing_ok=True)


def default_trace_path(algo: str) -> Path:
    """Where a run writes its trace when --trace is not given."""
    return Path(f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{algo}.jsonl")


def frames_path(trace: str | Path) -> Path:
    """Where a fast run keeps its steps' frames until it has built their records (fast/frames.py)."""
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


@dataclass
class StepMeta:
    """What the index keeps of a step record without parsing it."""
    line: int  # 1-based line number in the file
    step: int
    request: int
    accept_len: int
    committed: list[int]  # committed_tokens: what the timeline and token stream need
    timing: dict  # phase times in ms: what the running speed-up estimate needs


@dataclass
class Trace:
    """A fully read trace (`read_trace`): every step parsed and validated."""
    header: dict
    prefills: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    summary: dict | None = None
    tokens: dict[int, str] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # e.g. a torn last line, an unfinished run

    def token_text(self, token_id: int) -> str:
        return self.tokens.get(token_id, f"<{token_id}>")


def _check_step(rec: dict, lineno: int) -> None:
    for name, typ in STEP_FIELDS.items():
        if name not in rec:
            raise TraceError(f"line {lineno}: step record lacks field {name!r}")
        if not isinstance(rec[name], typ) or isinstance(rec[name], bool):
            raise TraceError(f"line {lineno}: step field {name!r} has the wrong type")
    if rec["accept_len"] != len(rec["correct_drafts"]) + 1:
        raise TraceError(f"line {lineno}: accept_len != len(correct_drafts) + 1")
    if rec["accept_tokens"] != rec["correct_drafts"] + [rec["bonus_token"]]:
        raise TraceError(f"line {lineno}: accept_tokens != correct_drafts + [bonus_token]")
    draft = rec["draft"] if isinstance(rec.get("draft"), dict) else {}
    parents, depths = draft.get("parents", []), draft.get("depths", [])
    for node, parent in enumerate(parents, start=1):  # a tree lists a parent before its children
        if not isinstance(parent, int) or isinstance(parent, bool) or not 0 <= parent < node:
            raise TraceError(f"line {lineno}: draft node {node}'s parent {parent!r} is not an earlier node")
        if isinstance(depths, list) and node <= len(depths) and \
                depths[node - 1] != (depths[parent - 1] if parent else 0) + 1:  # bounds what viewers allocate
            raise TraceError(f"line {lineno}: draft node {node}'s depth {depths[node - 1]!r} is not its parent's + 1")
    levels = (draft.get("candidates") or {}).get("levels", []) if isinstance(draft.get("candidates"), dict) else []
    if isinstance(levels, list) and any(not isinstance(v, int) or not 0 <= v < max(len(levels), 1) for v in levels):
        raise TraceError(f"line {lineno}: a draft candidate's level is not between 0 and its count")


# the writer's key order makes a step line start and end predictably: the index reads these
# fields with a regex and parses the whole record only when a viewer asks for it
_STEP_HEAD = re.compile(r'\{"kind": "step", "step": (\d+), "request": (\d+), ')
_ACCEPT_LEN = re.compile(r'"accept_len": (\d+), ')
_COMMITTED = re.compile(r'"committed_tokens": \[([0-9, ]*)\]')
_TIMING = re.compile(r'"timing": (\{[^{}]*\})')
_TOKENS = ', "tokens": {'


class _RecordError(ValueError):
    """Why a line is not a record, in a few words."""


def _unique_keys(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _RecordError(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def _parse(line: str) -> dict:
    """One record: a JSON object, no key twice (json would keep the last silently), nested no
    deeper than Python's parser recurses."""
    try:
        rec = json.loads(line, object_pairs_hook=_unique_keys)
    except _RecordError:
        raise
    except RecursionError:
        raise _RecordError("nested too deeply") from None
    except ValueError:
        raise _RecordError("not JSON") from None
    if not isinstance(rec, dict):
        raise _RecordError("not a JSON object")
    return rec


def _json_object(line: str):
    try:
        return _parse(line)
    except _RecordError:
        return None


class TraceFile:
    """A trace opened lazily, so ten thousand steps open in a blink: the header, prefill and
    summary records and a small index of the steps (`StepMeta`) are read at open, and each step
    record is parsed and validated when asked for (`step(i)`)."""

    def __init__(self, path: str | Path, recover: Recover | None = None):
        """recover: builds the records of the frames a fast run left beside the trace
        (spectrace/recovery.py); without it they are named in a notice."""
        self.path = path = Path(path)
        try:
            if not path.is_dir() and not stat.S_ISREG(os.stat(path).st_mode):
                raise TraceError(f"{path} is not a regular file (a FIFO or a device): a trace is a file")
            raw = path.read_bytes()
        except FileNotFoundError:
            raise TraceError(f"no trace file at {path}") from None
        except IsADirectoryError:
            raise TraceError(f"{path} is a directory, not a trace file") from None
        except OSError as e:
            raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{path} is not a spectrace trace (not UTF-8 text)") from None
        complete = text.endswith("\n")
        # no empty string after the final newline; a line an editor ended in CRLF reads as its text
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
        if not lines or not lines[0].strip():
            raise TraceError(f"trace {path} is empty")
        self.notices: list[str] = []
        if len(lines) > 1 and not complete and _json_object(lines[-1]) is None:
            lines.pop()
            self.notices.append(f"trace ends in a torn line (line {len(lines) + 1}); "
                                f"read up to the last complete record")
        self._lines = lines
        header = _json_object(lines[0])
        if header is None:
            raise TraceError(f"{path} is not a spectrace trace (line 1 is not a JSON header)")
        schema = header.get("schema")
        if header.get("kind") != "header" or not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
            raise TraceError(f"{path} is not a spectrace trace (no spectrace.trace header)")
        if schema != SCHEMA:
            raise TraceError(f"trace schema {schema} is not readable by this spectrace, which reads {SCHEMA}")
        for name in ("config", "models", "tokens"):
            if not isinstance(header.get(name, {}), dict):
                raise TraceError(f"{path} is not a spectrace trace (its header's {name} is not an object)")
        self.header = header
        self.prefills: list[dict] = []
        self.summary: dict | None = None
        self.index: list[StepMeta] = []
        self._seen_steps: dict[tuple[int, int], int] = {}  # (step, request) -> its line
        self.tokens: dict[int, str] = {}
        self._add_tokens(header.get("tokens", {}))
        for lineno, line in enumerate(lines[1:], start=2):
            if line.startswith('{"kind": "step"'):
                self._index_step(lineno, line)
                continue
            try:
                rec = _parse(line)
            except _RecordError as e:
                raise TraceError(f"trace {path} is corrupted at line {lineno} ({e})") from None
            self._add_tokens(rec.get("tokens", {}), lineno)
            kind = rec.get("kind")
            if kind == "prefill":
                self.prefills.append(rec)
            elif kind == "summary":
                self.summary = rec
            else:
                raise TraceError(f"trace {path} line {lineno}: unknown record kind {kind!r}")
        if frames_path(path).is_file():
            self._recover(recover)
        if self.summary is None:
            self.notices.append("the run did not finish: no summary record")
        self._cache: dict[int, dict] = {}

    def _recover(self, recover: Recover | None) -> None:
        """The step records of a fast run's frames that it never built (killed, or still running),
        added after the file's own lines, in memory: the file is not touched."""
        sidecar = frames_path(self.path).name
        if recover is None:
            self.notices.append(f"the run kept steps in {sidecar} that this reader does not build: open the "
                                "trace with spectrace's commands (replay, render, export)")
            return
        built = 0
        try:
            records, token_text = recover(self.path, self.header, set(self._seen_steps))
            fmt = RecordFormat(token_text, self.tokens)
            for rec, token_ids in records:
                self._lines.append(fmt.line(rec, token_ids).decode("utf-8").rstrip("\n"))
                self._index_step(len(self._lines), self._lines[-1])
                built += 1
        except SpectraceError as e:  # a step the explicit walk refuses: the steps before it
            self.notices.append(str(e))
        except (*MALFORMED, RuntimeError) as e:  # an edited or foreign sidecar: the steps before it
            self.notices.append(f"{sidecar} stops being readable after {built} records ({str(e)[:80]})")
        if built:
            self.notices.append(f"{built} step records built from {sidecar}, the frames the run kept of its steps")

    def _add_tokens(self, tokens, lineno: int = 1) -> None:
        if not isinstance(tokens, dict) or not all(isinstance(v, str) and k.isascii() and k.isdigit()
                                                   for k, v in tokens.items()):
            raise TraceError(f"trace {self.path} line {lineno}: \"tokens\" must map token ids to their text")
        longest = max(map(len, tokens.values()), default=0)
        if longest > MAX_TOKEN_CHARS:
            raise TraceError(f"trace {self.path} line {lineno}: a token's text of {longest:,} characters "
                             f"(a token has at most {MAX_TOKEN_CHARS:,})")
        self.tokens.update({int(k): v for k, v in tokens.items()})

    def view(self, i: int, show: Callable[[dict], object]):
        """show(step record i): what a viewer draws of it. A record whose fields have other
        shapes than the writer gives them (an edited or a foreign trace) ends in a TraceError
        naming its line, not in a traceback from deep inside the viewer."""
        rec = self.step(i)
        try:
            return show(rec)
        except MALFORMED as e:
            raise malformed(self.path, self.index[i].line, e) from None

    def _index_step(self, lineno: int, line: str) -> None:
        head, acc, com, tim = (_STEP_HEAD.match(line), _ACCEPT_LEN.search(line), _COMMITTED.search(line),
                               _TIMING.search(line))
        cut = line.rfind(_TOKENS)
        tokens = _json_object(line[cut + len(_TOKENS) - 1:-1]) if cut > 0 and line.endswith("}}") else None
        timing = _json_object(tim.group(1)) if tim else None
        if head is None or acc is None or com is None or tokens is None or timing is None:
            raise TraceError(f"trace {self.path} is corrupted at line {lineno} (not a step record)")
        key = (int(head.group(1)), int(head.group(2)))
        if key in self._seen_steps:
            raise TraceError(f"trace {self.path} line {lineno}: a second record of step {key[0]} of request "
                             f"{key[1]} (the first is at line {self._seen_steps[key]})")
        self._seen_steps[key] = lineno
        self._add_tokens(tokens, lineno)
        timing = {k: v for k, v in timing.items()  # phase times; what is not a finite number counts as absent
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        committed = [int(t) for t in com.group(1).split(",") if t.strip()]
        self.index.append(StepMeta(lineno, int(head.group(1)), int(head.group(2)), int(acc.group(1)), committed,
                                   timing))

    def __len__(self) -> int:
        return len(self.index)

    def step(self, i: int) -> dict:
        """The i-th step record of the file, parsed and validated."""
        if i not in self._cache:
            lineno = self.index[i].line
            try:
                rec = _parse(self._lines[lineno - 1])
            except _RecordError as e:
                raise TraceError(f"trace {self.path} is corrupted at line {lineno} ({e})") from None
            if rec.get("kind") != "step":
                raise TraceError(f"trace {self.path} is corrupted at line {lineno} (not a step record)")
            _check_step(rec, lineno)
            if len(self._cache) > 256:  # a viewer walks nearby steps; keep memory flat
                self._cache.clear()
            self._cache[i] = rec
        return self._cache[i]

    def token_text(self, token_id: int) -> str:
        return self.tokens.get(token_id, f"<{token_id}>")


def read_trace(path: str | Path, recover: Recover | None = None) -> Trace:
    """Read and validate a whole trace; raise TraceError with a one-line reason if it is unusable."""
    f = TraceFile(path, recover)
    steps = [f.step(i) for i in range(len(f))]
    return Trace(header=f.header, prefills=f.prefills, steps=steps, summary=f.summary, tokens=f.tokens,
                 notices=f.notices)
