"""Reading trace format v1 (core/trace.py): the header, prefill and summary records and an index
of the steps at open, each step record parsed and validated when asked for, so ten thousand steps
open in a blink. A torn last line is reported and skipped; a file that is not a regular file, a
field of the wrong type, a number or a string past its bound is refused in one line before
anything is allocated for it. Reading needs no torch; a fast run's steps, which it keeps as
frames beside the trace, come from a StepSource that builds them (spectrace/traces.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from spectrace.core.trace import (MALFORMED, SCHEMA, SCHEMA_PREFIX, TraceError, frames_path,
                                  has_frames, malformed)
from spectrace.errors import SpectraceError

MAX_TOKEN_CHARS = 2 ** 20  # a token's text: real vocabularies stay under a few hundred characters
STEP_FIELDS = {"step": int, "request": int, "correct_drafts": list, "bonus_token": int,
               "accept_tokens": list, "accept_len": int, "draft": (dict, type(None)),
               "verify": dict, "accept": dict, "kv": dict, "timing": dict}


class StepSource(Protocol):
    """The steps a fast run keeps in its frames (TRACE.frames; fast/records.py: FrameSteps)."""
    steps: list  # (step, request, accept_len, committed, timing, frame) of each step record
    notice: str | None  # why the frames stop early, if they do

    def lines(self, frame: int, tokens: dict[int, str]) -> dict[int, str]:
        """A frame's step records as trace lines, by request; each carries the text of the
        token ids it mentions that `tokens` lacks."""

    def texts(self, ids: set[int]) -> dict[int, str]:
        """The text of token ids (the target's tokenizer, where it still loads)."""


# (trace, its header, the (step, request) pairs its lines hold) -> its frames' steps but those
OpenFrames = Callable[[Path, dict, set], StepSource]


@dataclass
class StepMeta:
    """What the index keeps of a step record without parsing (or building) it."""
    line: int  # 1-based line number in the file; 0: the record is in a frame
    step: int
    request: int
    accept_len: int
    committed: list[int]  # committed_tokens: what the timeline and token stream need
    timing: dict  # phase times in ms: what the running speed-up estimate needs
    frame: int = -1  # the frame of TRACE.frames that holds the step (StepSource.lines)

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.line else f"step {self.step}, request {self.request}"


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


def _check_step(rec: dict, lineno: str) -> None:
    """lineno: where the record is, "line N" (StepMeta.where)."""
    for name, typ in STEP_FIELDS.items():
        if name not in rec:
            raise TraceError(f"{lineno}: step record lacks field {name!r}")
        if not isinstance(rec[name], typ) or isinstance(rec[name], bool):
            raise TraceError(f"{lineno}: step field {name!r} has the wrong type")
    if rec["accept_len"] != len(rec["correct_drafts"]) + 1:
        raise TraceError(f"{lineno}: accept_len != len(correct_drafts) + 1")
    if rec["accept_tokens"] != rec["correct_drafts"] + [rec["bonus_token"]]:
        raise TraceError(f"{lineno}: accept_tokens != correct_drafts + [bonus_token]")
    draft = rec["draft"] if isinstance(rec.get("draft"), dict) else {}
    parents, depths = draft.get("parents", []), draft.get("depths", [])
    for node, parent in enumerate(parents, start=1):  # a tree lists a parent before its children
        if not isinstance(parent, int) or isinstance(parent, bool) or not 0 <= parent < node:
            raise TraceError(f"{lineno}: draft node {node}'s parent "
                             f"{parent!r} is not an earlier node")
        # bounds what viewers allocate
        if isinstance(depths, list) and node <= len(depths) and \
                depths[node - 1] != (depths[parent - 1] if parent else 0) + 1:
            raise TraceError(f"{lineno}: draft node {node}'s depth "
                             f"{depths[node - 1]!r} is not its parent's + 1")
    levels = ((draft.get("candidates") or {}).get("levels", [])
              if isinstance(draft.get("candidates"), dict) else [])
    if isinstance(levels, list) and any(not isinstance(v, int) or not 0 <= v < max(len(levels), 1)
                                        for v in levels):
        raise TraceError(f"{lineno}: a draft candidate's level is not between 0 and its count")


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


def _header(path: Path, line: str) -> dict:
    """A trace's first line, checked to be a header of the schema this spectrace reads."""
    header = _json_object(line)
    if header is None:
        raise TraceError(f"{path} is not a spectrace trace (line 1 is not a JSON header)")
    schema = header.get("schema")
    if header.get("kind") != "header" or not isinstance(schema, str) or \
            not schema.startswith(SCHEMA_PREFIX):
        raise TraceError(f"{path} is not a spectrace trace (no spectrace.trace header)")
    if schema != SCHEMA:
        raise TraceError(f"trace schema {schema} is not readable "
                         f"by this spectrace, which reads {SCHEMA}")
    for name in ("config", "models", "tokens"):
        if not isinstance(header.get(name, {}), dict):
            raise TraceError(f"{path} is not a spectrace trace (its "
                             f"header's {name} is not an object)")
    return header


def _timing(timing: dict) -> dict:
    """Phase times; what is not a finite number counts as absent."""
    return {k: v for k, v in timing.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _json_object(line: str):
    try:
        return _parse(line)
    except _RecordError:
        return None


class TraceFile:
    """A trace opened lazily, so ten thousand steps open in a blink: the header, prefill and
    summary records and a small index of the steps (`StepMeta`) are read at open, and each step
    record is parsed and validated when asked for (`step(i)`)."""

    def __init__(self, path: str | Path, frames: OpenFrames | None = None):
        """frames: opens the steps a fast run keeps as frames beside the trace
        (spectrace/traces.py), built when read; without it they are named in a notice."""
        self.path = path = Path(path)
        try:
            if not path.is_dir() and not stat.S_ISREG(os.stat(path).st_mode):
                raise TraceError(f"{path} is not a regular file (a FIFO "
                                 f"or a device): a trace is a file")
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
        self.header = header = _header(path, lines[0])
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
        self._open_frames(frames)
        if self.summary is None:
            self.notices.append("the run did not finish: no summary record")
        self._cache: dict[int, dict] = {}

    def _open_frames(self, frames: OpenFrames | None) -> None:
        """A fast run's steps, kept in TRACE.frames (all of them, or those it had not yet written
        into the trace when it was killed): indexed from the frames' heads, each built when asked
        for (`step`); the files are not touched."""
        sidecar, self._frames = frames_path(self.path).name, None
        self._framed: dict[int, dict[int, str]] = {}  # the lines built of frames read lately
        if not has_frames(self.path):
            # a FIFO would block the reading, a device never end
            with contextlib.suppress(OSError):  # OSError: a name too long with .frames added
                if frames_path(self.path).exists():
                    self.notices.append(f"{sidecar} is not a regular file: its steps are not read")
            return
        if frames is None:
            self.notices.append(f"the run kept its steps in {sidecar}, which this "
                                f"reader does not build: open the trace with "
                                f"spectrace's commands (replay, render, report, export)")
            return
        self._frames = frames(self.path, self.header, set(self._seen_steps))
        if self._frames.notice:
            self.notices.append(self._frames.notice)
        timings: dict[int, dict] = {}  # a frame's phase times, shared by its requests' metas
        for step, request, accept_len, committed, timing, frame in self._frames.steps:
            if frame not in timings:
                timings[frame] = _timing(timing)
            timing = timings[frame]
            if (step, request) in self._seen_steps:
                raise TraceError(f"trace {self.path}: {sidecar} holds "
                                 f"step {step} of request {request} twice")
            self._seen_steps[(step, request)] = 0
            self.index.append(StepMeta(0, step, request, accept_len, committed, timing, frame))
        missing = {t for meta in self.index for t in meta.committed} - self.tokens.keys()
        if missing:  # a killed run's summary would have carried them
            self.tokens.update(self._frames.texts(missing))

    def _add_tokens(self, tokens, lineno: int = 1) -> None:
        if not isinstance(tokens, dict) or not all(isinstance(v, str) and k.isascii()
                                                   and k.isdigit() for k, v in tokens.items()):
            raise TraceError(f"trace {self.path} line {lineno}: \"tokens\" "
                             f"must map token ids to their text")
        longest = max(map(len, tokens.values()), default=0)
        if longest > MAX_TOKEN_CHARS:
            raise TraceError(f"trace {self.path} line {lineno}: a token's text of {longest:,} "
                             f"characters (a token has at most {MAX_TOKEN_CHARS:,})")
        self.tokens.update({int(k): v for k, v in tokens.items()})

    def view(self, i: int, show: Callable[[dict], object]):
        """show(step record i): what a viewer draws of it. A record whose fields have other
        shapes than the writer gives them (an edited or a foreign trace) ends in a TraceError
        naming its line, not in a traceback from deep inside the viewer."""
        rec = self.step(i)
        try:
            return show(rec)
        except MALFORMED as e:
            raise malformed(self.path, self.index[i].where, e) from None

    def _index_step(self, lineno: int, line: str) -> None:
        head, acc, com, tim = (_STEP_HEAD.match(line), _ACCEPT_LEN.search(line),
                               _COMMITTED.search(line), _TIMING.search(line))
        cut = line.rfind(_TOKENS)
        tokens = (_json_object(line[cut + len(_TOKENS) - 1:-1]) if cut > 0 and line.endswith("}}")
                  else None)
        timing = _json_object(tim.group(1)) if tim else None
        if head is None or acc is None or com is None or tokens is None or timing is None:
            raise TraceError(f"trace {self.path} is corrupted at line {lineno} (not a step record)")
        key = (int(head.group(1)), int(head.group(2)))
        if key in self._seen_steps:
            raise TraceError(f"trace {self.path} line {lineno}: a second record of step {key[0]} "
                             f"of request {key[1]} (the first is at line {self._seen_steps[key]})")
        self._seen_steps[key] = lineno
        self._add_tokens(tokens, lineno)
        timing = _timing(timing)
        committed = [int(t) for t in com.group(1).split(",") if t.strip()]
        self.index.append(StepMeta(lineno, int(head.group(1)), int(head.group(2)),
                                   int(acc.group(1)), committed, timing))

    def __len__(self) -> int:
        return len(self.index)

    def step(self, i: int) -> dict:
        """The i-th step record of the trace, parsed (or built from its frame) and validated."""
        if i not in self._cache:
            meta = self.index[i]
            line = self._lines[meta.line - 1] if meta.line else self._framed_line(meta)
            try:
                rec = _parse(line)
            except _RecordError as e:
                raise TraceError(f"trace {self.path} is corrupted at {meta.where} ({e})") from None
            if rec.get("kind") != "step":
                raise TraceError(f"trace {self.path} is corrupted at "
                                 f"{meta.where} (not a step record)")
            if not meta.line:
                self._add_tokens(rec.get("tokens", {}))
            _check_step(rec, meta.where)
            if len(self._cache) > 256:  # a viewer walks nearby steps; keep memory flat
                self._cache.clear()
            self._cache[i] = rec
        return self._cache[i]

    def _framed_line(self, meta: StepMeta) -> str:
        """A step's record as its frame builds it (the whole frame's, kept for the next ask)."""
        if meta.frame not in self._framed:
            sidecar = frames_path(self.path).name
            try:
                lines = self._frames.lines(meta.frame, self.tokens)
            except SpectraceError as e:  # the kernels' walk and the explicit one disagree
                raise TraceError(f"trace {self.path}: {e}") from None
            except (*MALFORMED, RuntimeError) as e:
                raise TraceError(f"trace {self.path}: {sidecar} is not readable at step "
                                 f"{meta.step} ({str(e)[:80]})") from None
            if len(self._framed) > 16:
                self._framed.clear()
            self._framed[meta.frame] = lines
        return self._framed[meta.frame][meta.request]

    def token_text(self, token_id: int) -> str:
        return self.tokens.get(token_id, f"<{token_id}>")


def read_trace(path: str | Path, frames: OpenFrames | None = None) -> Trace:
    """Read and validate a whole trace; raise TraceError with a one-line reason if it is
    unusable."""
    f = TraceFile(path, frames)
    steps = [f.step(i) for i in range(len(f))]
    return Trace(header=f.header, prefills=f.prefills, steps=steps, summary=f.summary,
                 tokens=f.tokens, notices=f.notices)
